#!/usr/bin/env python3
"""Oracle for MoE routing (kernels/moe.h route_topk): mlx-lm's own routing code on mlx's CPU.

Each family's routing runs inside its real module — Qwen3MoeSparseMoeBlock, Qwen3NextSparseMoeBlock
(Qwen3.5-MoE reuses it), gemma4_text.Router, gpt_oss.MLPBlock, MixtralSparseMoeBlock — with the
router projection replaced by a module that returns the case's logits and the experts by one that
records the ids it is handed and returns one-hot rows, so the block's output is Σ_j w_j·onehot(id_j):
the routing weights scattered to their experts. The recorded ids keep mlx's argpartition order.

Logits: random normals, and tied ones (rounded to halves; all zero) so the tie rule is checked.
Writes <out>/moe_route/<stem>.{logits,weights,scale} (f32) and .ids (i32), and index.json.
"""
import argparse
import json
import os
from types import SimpleNamespace

import numpy as np

# (family, E, k, norm_topk_prob)
CASES = [
    ("qwen3_moe", 8, 2, False),
    ("qwen3_moe", 128, 8, True),
    ("qwen3_moe", 60, 4, False),
    ("qwen3_next", 512, 10, True),
    ("qwen3_next", 64, 4, False),
    ("gemma4", 128, 8, False),
    ("gemma4", 16, 3, False),
    ("gpt_oss", 32, 4, False),
    ("gpt_oss", 128, 4, False),
    ("mixtral", 8, 2, False),
    ("mixtral", 40, 5, False),
]
N = 24  # tokens per case


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", default="")
    args = ap.parse_args()

    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import gemma4_text, gpt_oss, mixtral, qwen3_moe, qwen3_next

    mx.set_default_device(mx.cpu)
    d = os.path.join(args.out, "moe_route")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(42)

    class Logits(nn.Module):  # the router projection: returns the case's logits
        def __init__(self, logits):
            super().__init__()
            self._logits = logits

        def __call__(self, x):
            return self._logits

    class OneHot(nn.Module):  # the experts: records the ids, returns onehot(id) per slot
        def __init__(self, E):
            super().__init__()
            self._E = E
            self.inds = None

        def __call__(self, x, inds):
            self.inds = inds
            return (inds[..., None] == mx.arange(self._E)).astype(mx.float32)

    class Zeros(nn.Module):
        def __call__(self, x):
            return mx.zeros(x.shape[:-1] + (1,))

    cases = []
    for ci, (family, E, k, norm) in enumerate(CASES):
        for mode in ("randn", "halves", "zeros"):
            logits = rng.standard_normal((N, E)).astype(np.float32) * 2
            if mode == "halves":
                logits = np.round(logits * 2) / 2
            elif mode == "zeros":
                logits = np.zeros((N, E), np.float32)
            lg = mx.array(logits)[None]
            x = mx.zeros((1, N, E))
            experts = OneHot(E)
            scale = None
            if family in ("qwen3_moe", "qwen3_next"):
                a = SimpleNamespace(hidden_size=E, moe_intermediate_size=8, num_experts=E, num_experts_per_tok=k,
                                    norm_topk_prob=norm, shared_expert_intermediate_size=8)
                block = (qwen3_moe.Qwen3MoeSparseMoeBlock if family == "qwen3_moe" else
                         qwen3_next.Qwen3NextSparseMoeBlock)(a)
                block.gate = Logits(lg)
                block.switch_mlp = experts
                if family == "qwen3_next":
                    block.shared_expert = Zeros()
                    block.shared_expert_gate = Zeros()
                dense = block(x)
                ids, weights = experts.inds, None
            elif family == "gemma4":
                a = SimpleNamespace(rms_norm_eps=1e-6, hidden_size=E, num_experts=E, top_k_experts=k)
                router = gemma4_text.Router(a)
                router.proj = Logits(lg)
                scale = (0.5 + rng.random(E)).astype(np.float32)
                router.per_expert_scale = mx.array(scale)
                ids, weights = router(x)
                dense = None
            elif family == "gpt_oss":
                a = SimpleNamespace(hidden_size=E, num_local_experts=E, num_experts_per_tok=k, intermediate_size=8,
                                    swiglu_limit=7.0)
                block = gpt_oss.MLPBlock(a)
                block.router = Logits(lg)
                block.experts = experts
                dense = block(x)
                ids, weights = experts.inds, None
            else:
                a = SimpleNamespace(hidden_size=E, intermediate_size=8, num_local_experts=E, num_experts_per_tok=k)
                block = mixtral.MixtralSparseMoeBlock(a)
                block.gate = Logits(lg)
                block.switch_mlp = experts
                dense = block(x)
                ids, weights = experts.inds, None
            ids = np.array(ids[0]).astype(np.int32)
            if weights is None:
                # The block's output holds each selected expert's weight at its id.
                dense = np.array(dense[0]).astype(np.float32)
                weights = np.take_along_axis(dense, ids.astype(np.int64), axis=-1)
            else:
                weights = np.array(weights[0]).astype(np.float32)
            stem = f"{family}_e{E}_k{k}_{mode}_{ci}"
            logits.tofile(os.path.join(d, f"{stem}.logits"))
            ids.tofile(os.path.join(d, f"{stem}.ids"))
            weights.astype(np.float32).tofile(os.path.join(d, f"{stem}.weights"))
            if scale is not None:
                scale.tofile(os.path.join(d, f"{stem}.scale"))
            cases.append({"stem": stem, "family": family, "n": N, "experts": E, "k": k, "norm_topk_prob": norm,
                          "scale": scale is not None})
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(cases, f)
    print(f"moe_route: {len(cases)} cases in {d}")


if __name__ == "__main__":
    main()
