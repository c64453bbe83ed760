#!/usr/bin/env python3
"""Oracle for the GGUF K-quant decoders (Q4_K, Q5_K, Q6_K): gguf-py's own numpy dequantizer.

gguf-py 0.19 decodes K-quants (gguf.quants.dequantize) but cannot produce them, so this file
also holds a small numpy quantizer for Q4_K, Q5_K and Q6_K (`quantize_kquant`), written from the
block layout (ggml's GGUF type table): any bytes are a valid block, the quantizer only makes them
resemble real weights; the oracle is always gguf-py's decoding of the bytes. model_reference.py
imports it for the K-quant model cases.

Writes <out>/kquant/<fmt>_<rows>x<cols>_<kind>.{bin,f32} and index.json: `.bin` the blocks as a
GGUF stores them, `.f32` gguf.quants.dequantize of them. kind `q`: quantized gaussian data with an
outlier row, an all-zero row, a constant row and an all-positive row; kind `raw`: uniformly random
bytes (every bit pattern of scales, mins and codes) with finite f16 super-scales.
"""
import argparse
import json
import os
import sys

import numpy as np
import gguf

QK = 256
BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def _f16(a):
    return np.asarray(a, dtype=np.float32).astype(np.float16)


def _pack_scale_min(sc, m):
    """[nb, 8] 6-bit scales and mins -> [nb, 12] bytes (Q4_K/Q5_K layout)."""
    sc = sc.astype(np.uint8)
    m = m.astype(np.uint8)
    s = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    s[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return s


def _quantize_min_scale(x, levels):
    """x [nb, 256] -> (d, dmin f16 [nb], sc, m [nb, 8], codes [nb, 256] in 0..levels)."""
    nb = x.shape[0]
    xs = x.reshape(nb, 8, 32)
    lo = np.minimum(xs.min(axis=-1), 0.0)
    hi = xs.max(axis=-1)
    scale = (hi - lo) / levels  # per sub-block, >= 0
    mins = -lo  # >= 0
    d = _f16(scale.max(axis=-1) / 63.0)
    dmin = _f16(mins.max(axis=-1) / 63.0)
    df, dmf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df > 0, np.round(scale / df), 0).clip(0, 63)
        m = np.where(dmf > 0, np.round(mins / dmf), 0).clip(0, 63)
        eff_s = (df * sc)[:, :, None]
        eff_m = (dmf * m)[:, :, None]
        q = np.where(eff_s > 0, np.round((xs + eff_m) / eff_s), 0).clip(0, levels)
    return d, dmin, sc, m, q.reshape(nb, QK).astype(np.uint8)


def quantize_kquant(w, fmt):
    """f32 [rows, cols] (cols % 256 == 0) -> uint8 [rows, cols/256*block_bytes] blocks."""
    rows, cols = w.shape
    assert cols % QK == 0, (rows, cols)
    x = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, QK)
    nb = x.shape[0]
    if fmt in ("Q4_K", "Q5_K"):
        d, dmin, sc, m, q = _quantize_min_scale(x, 15 if fmt == "Q4_K" else 31)
        qc = q.reshape(nb, 4, 2, 32)  # chunk c, sub-block 2c / 2c+1, l
        qs = ((qc[:, :, 0] & 15) | ((qc[:, :, 1] & 15) << 4)).reshape(nb, 128)
        parts = [d.reshape(nb, 1).view(np.uint8), dmin.reshape(nb, 1).view(np.uint8), _pack_scale_min(sc, m)]
        if fmt == "Q5_K":
            hb = (q.reshape(nb, 8, 32) >> 4) & 1  # sub-block g -> bit g of byte l
            qh = np.zeros((nb, 32), dtype=np.uint8)
            for g in range(8):
                qh |= (hb[:, g] << g).astype(np.uint8)
            parts.append(qh)
        parts.append(qs.astype(np.uint8))
        out = np.concatenate(parts, axis=1)
    elif fmt == "Q6_K":
        xs = x.reshape(nb, 16, 16)
        amax = np.abs(xs).max(axis=-1)
        scale = amax / 31.0
        d = _f16(scale.max(axis=-1) / 127.0)
        df = d.astype(np.float32)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(df > 0, np.round(scale / df), 0).clip(-128, 127)
            eff = (df * sc)[:, :, None]
            q = np.where(eff > 0, np.round(xs / eff), 0).clip(-32, 31)
        u = (q.reshape(nb, 2, 4, 32) + 32).astype(np.uint8)  # half h, k, l
        ql = np.concatenate([(u[:, :, 0] & 15) | ((u[:, :, 2] & 15) << 4),
                             (u[:, :, 1] & 15) | ((u[:, :, 3] & 15) << 4)], axis=2).reshape(nb, 128)
        qh = ((u[:, :, 0] >> 4) | ((u[:, :, 1] >> 4) << 2) | ((u[:, :, 2] >> 4) << 4) |
              ((u[:, :, 3] >> 4) << 6)).reshape(nb, 64)
        out = np.concatenate([ql.astype(np.uint8), qh.astype(np.uint8), sc.astype(np.int8).view(np.uint8),
                              d.reshape(nb, 1).view(np.uint8)], axis=1)
    else:
        raise ValueError(fmt)
    assert out.shape == (nb, BLOCK_BYTES[fmt]), out.shape
    return out.reshape(rows, cols // QK * BLOCK_BYTES[fmt])


def dequantize(q, fmt, shape):
    qt = getattr(gguf.GGMLQuantizationType, fmt)
    return gguf.quants.dequantize(q, qt).reshape(shape).astype(np.float32)


def raw_blocks(rows, cols, fmt, rng):
    nb = rows * cols // QK
    b = rng.integers(0, 256, (nb, BLOCK_BYTES[fmt]), dtype=np.uint8)
    sc = _f16(rng.uniform(-0.05, 0.05, nb)).view(np.uint8).reshape(nb, 2)
    if fmt == "Q6_K":
        b[:, 208:210] = sc
    else:
        b[:, 0:2] = sc
        b[:, 2:4] = _f16(rng.uniform(0, 0.05, nb)).view(np.uint8).reshape(nb, 2)
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
    d = os.path.join(a.out, "kquant")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(77)
    cases = []
    for fmt in ("Q4_K", "Q5_K", "Q6_K"):
        for rows, cols in SHAPES:
            for kind in ("q", "raw"):
                if kind == "q":
                    w = data(rows, cols, rng)
                    q = quantize_kquant(w, fmt)
                    deq = dequantize(q, fmt, (rows, cols))
                    # The quantizer is only a data generator, but a broken one would test little.
                    err = np.abs(deq - w).max(axis=1) / np.maximum(np.abs(w).max(axis=1), 1e-6)
                    assert np.all(err < 0.2), (fmt, rows, cols, err)
                else:
                    q = raw_blocks(rows, cols, fmt, rng)
                    deq = dequantize(q, fmt, (rows, cols))
                assert np.all(np.isfinite(deq))
                stem = f"{fmt.lower()}_{rows}x{cols}_{kind}"
                q.tofile(os.path.join(d, stem + ".bin"))
                deq.tofile(os.path.join(d, stem + ".f32"))
                cases.append({"format": fmt, "rows": rows, "cols": cols, "stem": stem})
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(cases, f)
    print(f"kquant_reference: {len(cases)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
