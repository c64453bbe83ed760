#!/usr/bin/env python3
"""Oracle for the Gated DeltaNet kernels (kernels/gated_delta.h): mlx-lm's own code on mlx's CPU.

For each case (random shapes: decode n = 1, GQA ratios 1..3, odd channel counts, a chunk-crossing
prefill with Qwen3.5's head dims) it runs the steps of mlx-lm's GatedDeltaNet layer
(mlx_lm/models/qwen3_5.py) on random inputs, from a random non-zero conv and recurrent state:

  conv   nn.Conv1d(C, C, K, groups=C, bias=False) over state ++ x, then nn.silu; the new conv state is
         the last K-1 rows of state ++ x (as the layer's cache update does)
  qk     gated_delta.normalize_qk(q, k, inv_scale=d_k**-0.5, eps=1e-6) on the conv output's q/k
  gates  gated_delta.compute_g(A_log, a, dt_bias) and mx.sigmoid(b)
  delta  gated_delta.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state) (CPU: the ops path)
  norm   qwen3_next.Qwen3NextRMSNormGated(d_v, eps)(y, z) with a random weight

Writes <out>/gated_delta/<stem>.<name> (raw little-endian f32) and index.json listing the cases
with their shapes. Each step's inputs are the previous step's mlx outputs, so the C++ test checks
each kernel alone.
"""
import argparse
import json
import os

import numpy as np

# (n, H_k, H_v, d_k, d_v, K, eps)
CASES = [
    (1, 1, 1, 8, 8, 4, 1e-6),
    (1, 2, 4, 32, 16, 4, 1e-6),
    (5, 1, 3, 7, 5, 3, 1e-5),
    (9, 3, 3, 12, 20, 2, 1e-6),
    (17, 2, 2, 64, 48, 4, 1e-6),
    (70, 2, 4, 128, 128, 4, 1e-6),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", default="")
    args = ap.parse_args()

    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.gated_delta import compute_g, gated_delta_update, normalize_qk
    from mlx_lm.models.qwen3_next import Qwen3NextRMSNormGated

    mx.set_default_device(mx.cpu)
    d = os.path.join(args.out, "gated_delta")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(40)
    f32 = lambda a: np.asarray(a, dtype=np.float32)
    cases = []
    for n, hk, hv, dk, dv, K, eps in CASES:
        key_dim, value_dim = hk * dk, hv * dv
        C = 2 * key_dim + value_dim
        stem = f"gd_n{n}_hk{hk}_hv{hv}_dk{dk}_dv{dv}_k{K}"
        arrs = {}
        arrs["x"] = f32(rng.standard_normal((n, C)))
        arrs["conv_w"] = f32(rng.standard_normal((C, K)) * 0.5)
        arrs["conv_state"] = f32(rng.standard_normal((K - 1, C)))
        arrs["a"] = f32(rng.standard_normal((n, hv)))
        arrs["b"] = f32(rng.standard_normal((n, hv)))
        arrs["a_log"] = f32(np.log(rng.uniform(1, 16, hv)))
        arrs["dt_bias"] = f32(rng.uniform(0, 1, hv))
        arrs["state"] = f32(rng.standard_normal((hv, dv, dk)) * 0.1)
        arrs["z"] = f32(rng.standard_normal((n, hv, dv)))
        arrs["norm_w"] = f32(1 + 0.1 * rng.standard_normal(dv))

        conv = nn.Conv1d(C, C, K, groups=C, bias=False)
        conv.weight = mx.array(arrs["conv_w"]).reshape(C, K, 1)  # mlx's layout [out, K, in/groups]
        conv_in = mx.concatenate([mx.array(arrs["conv_state"])[None], mx.array(arrs["x"])[None]], axis=1)
        conv_out = nn.silu(conv(conv_in))  # [1, n, C]
        arrs["conv_out"] = f32(conv_out[0])
        arrs["conv_state_out"] = f32(conv_in[0, -(K - 1):, :]) if K > 1 else np.zeros((0, C), np.float32)

        q = conv_out[..., :key_dim].reshape(1, n, hk, dk)
        k = conv_out[..., key_dim:2 * key_dim].reshape(1, n, hk, dk)
        v = conv_out[..., 2 * key_dim:].reshape(1, n, hv, dv)
        qn, kn = normalize_qk(q, k, inv_scale=dk ** -0.5, eps=1e-6)
        arrs["q_norm"] = f32(qn[0])
        arrs["k_norm"] = f32(kn[0])

        a, b = mx.array(arrs["a"])[None], mx.array(arrs["b"])[None]
        A_log, dt_bias = mx.array(arrs["a_log"]), mx.array(arrs["dt_bias"])
        arrs["g"] = f32(compute_g(A_log, a, dt_bias)[0])
        arrs["beta"] = f32(mx.sigmoid(b)[0])

        y, st = gated_delta_update(qn, kn, v, a, b, A_log, dt_bias, mx.array(arrs["state"])[None])
        arrs["y"] = f32(y[0])
        arrs["state_out"] = f32(st[0])

        norm = Qwen3NextRMSNormGated(dv, eps=eps)
        norm.weight = mx.array(arrs["norm_w"])
        arrs["norm_out"] = f32(norm(y, mx.array(arrs["z"])[None])[0])

        for name, arr in arrs.items():
            f32(arr).tofile(os.path.join(d, f"{stem}.{name}"))
        cases.append({"stem": stem, "n": n, "n_k_heads": hk, "n_v_heads": hv, "d_k": dk, "d_v": dv, "kernel": K,
                      "eps": eps})
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(cases, f)
    print(f"gated_delta: {len(cases)} cases in {d}")


if __name__ == "__main__":
    main()
