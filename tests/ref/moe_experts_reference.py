#!/usr/bin/env python3
"""Oracle for the stacked-expert binder (models/weights.h WeightBinder::experts): small MoE
checkpoints in each layout larder reads, written by the formats' own tools, with each expert's
weights dequantized by those tools.

  gguf/experts.gguf   blk.0.ffn_{gate,up,down}_exps.weight, blk.0.ffn_gate_exps.weight in Q4_0, up in
                      Q4_K (random codes), down in F16 (gguf-py's GGUFWriter, quants.quantize /
                      dequantize)
  mlx/                layers.0.mlp.switch_mlp.{gate,up}_proj.{weight,scales,biases}: mx.quantize of a
                      stacked [E, rows, cols] array (gate 4-bit g64 with BF16 scales per the top-level
                      config, up 8-bit g32 with F32 scales by a per-module entry), down_proj unquantized BF16 [E, cols, rows]
  hf/                 model.layers.0.mlp.experts.{i}.{gate,up,down}_proj.weight, one BF16 tensor per
                      expert

  gemma4/             model.layers.0.experts.gate_up_proj [E, 2·I, H] (gate and up fused along rows, split by
                      mx.split as mlx-lm's sanitize does) and experts.down_proj, BF16

(safetensors' numpy writer has no BF16: write_safetensors below writes the format by hand.)

For each bound matrix <dir>/<name>.f32 holds the oracle's dequantization [E, rows, cols], and
index.json the shapes.
"""
import argparse
import json
import os

import numpy as np

E, H, I = 4, 256, 64  # experts, hidden (cols of gate/up), moe intermediate (their rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", default="")
    args = ap.parse_args()

    import gguf
    import mlx.core as mx
    from safetensors.numpy import save_file

    mx.set_default_device(mx.cpu)
    root = os.path.join(args.out, "moe_experts")
    rng = np.random.default_rng(11)
    index = {"experts": E, "hidden": H, "intermediate": I, "cases": []}

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    # GGUF: ggml's experts tensors, stacked [E, rows, cols] outermost-first.
    d = os.path.join(root, "gguf")
    os.makedirs(d, exist_ok=True)
    w = gguf.GGUFWriter(os.path.join(d, "experts.gguf"), "qwen3moe")
    for name, qt, shape in [("ffn_gate_exps", gguf.GGMLQuantizationType.Q4_0, (E, I, H)),
                            ("ffn_up_exps", gguf.GGMLQuantizationType.Q4_K, (E, I, H)),
                            ("ffn_down_exps", gguf.GGMLQuantizationType.F16, (E, H, I))]:
        x = rand(*shape)
        if qt == gguf.GGMLQuantizationType.F16:
            data = x.astype(np.float16)
            deq = data.astype(np.float32)
            w.add_tensor(f"blk.0.{name}.weight", data)
        elif qt == gguf.GGMLQuantizationType.Q4_K:
            # gguf-py has no K-quant quantizer: random codes with small f16 d and dmin, which it decodes.
            blocks = rng.integers(0, 256, (E * shape[1] * shape[2] // 256, 144), dtype=np.uint8)
            blocks[:, 0:4] = np.frombuffer(
                rng.uniform(0.001, 0.01, (blocks.shape[0], 2)).astype(np.float16).tobytes(), np.uint8).reshape(-1, 4)
            data = blocks.reshape(E, shape[1], shape[2] // 256 * 144)
            deq = gguf.quants.dequantize(data, qt).astype(np.float32).reshape(shape)
            w.add_tensor(f"blk.0.{name}.weight", data, raw_dtype=qt)
        else:
            data = gguf.quants.quantize(x, qt)
            deq = gguf.quants.dequantize(data, qt).astype(np.float32).reshape(shape)
            w.add_tensor(f"blk.0.{name}.weight", data, raw_dtype=qt)
        deq.tofile(os.path.join(d, f"{name}.f32"))
        index["cases"].append({"layout": "gguf", "name": name, "shape": list(shape), "format": qt.name})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # MLX: switch_mlp stacked, quantized by mx.quantize along the last axis.
    d = os.path.join(root, "mlx")
    os.makedirs(d, exist_ok=True)
    tensors, bf16 = {}, {"model.layers.0.mlp.switch_mlp.down_proj.weight"}
    for proj, bits, gs, shape in [("gate_proj", 4, 64, (E, I, H)), ("up_proj", 8, 32, (E, I, H)),
                                  ("down_proj", 0, 0, (E, H, I))]:
        x = mx.array(rand(*shape))
        p = f"model.layers.0.mlp.switch_mlp.{proj}"
        if bits:
            # gate from BF16 weights (BF16 scales, as mlx-lm converts a BF16 model), up from F32 ones.
            src = x.astype(mx.bfloat16) if proj == "gate_proj" else x
            q, s, b = mx.quantize(src, group_size=gs, bits=bits)
            tensors[p + ".weight"] = np.array(q)
            for suffix, a in ((".scales", s), (".biases", b)):
                if a.dtype == mx.bfloat16:
                    tensors[p + suffix] = np.array(a.view(mx.uint16)).view(np.uint16)
                    bf16.add(p + suffix)
                else:
                    tensors[p + suffix] = np.array(a)
            # In f32 (BF16 scales widen exactly): mlx's BF16 dequantize would round each value to BF16.
            deq = np.array(mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32), group_size=gs, bits=bits))
        else:
            xb = x.astype(mx.bfloat16)
            tensors[p + ".weight"] = np.array(xb.view(mx.uint16)).view(np.uint16)
            deq = np.array(xb.astype(mx.float32))
        deq.astype(np.float32).tofile(os.path.join(d, f"{proj}.f32"))
        index["cases"].append({"layout": "mlx", "name": proj, "shape": list(shape), "bits": bits, "group_size": gs})
    # safetensors' numpy writer has no bf16: write the header by hand for the BF16 tensor.
    write_safetensors(os.path.join(d, "model.safetensors"), tensors, bf16=bf16)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3_moe", "quantization": {"group_size": 64, "bits": 4,
                   "model.layers.0.mlp.switch_mlp.up_proj": {"group_size": 32, "bits": 8}}}, f)

    # MLX microscaling modes (kernels/microscaling.h): gate mxfp4 by the top-level mode, up nvfp4 by
    # a per-module entry, down mxfp8 with no entry (inferred from its U8 scales, as mlx-lm does).
    d = os.path.join(root, "mlx_fp")
    os.makedirs(d, exist_ok=True)
    tensors = {}
    for proj, mode, shape in [("gate_proj", "mxfp4", (E, I, H)), ("up_proj", "nvfp4", (E, I, H)),
                              ("down_proj", "mxfp8", (E, H, I))]:
        x = mx.array(rand(*shape)).astype(mx.bfloat16)
        q, s = mx.quantize(x, mode=mode)
        p = f"model.layers.0.mlp.switch_mlp.{proj}"
        tensors[p + ".weight"] = np.array(q)
        tensors[p + ".scales"] = np.array(s)
        np.array(mx.dequantize(q, s, mode=mode, dtype=mx.float32)).tofile(os.path.join(d, f"{proj}.f32"))
        index["cases"].append({"layout": "mlx_fp", "name": proj, "shape": list(shape), "mode": mode})
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3_moe", "quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4",
                   "model.layers.0.mlp.switch_mlp.up_proj": {"group_size": 16, "bits": 4, "mode": "nvfp4"}}}, f)

    # GGUF MXFP4 experts (gpt-oss's format), gguf-py's quantizer.
    d = os.path.join(root, "gguf_mxfp4")
    os.makedirs(d, exist_ok=True)
    w = gguf.GGUFWriter(os.path.join(d, "experts.gguf"), "qwen3moe")
    qt = gguf.GGMLQuantizationType.MXFP4
    for name, shape in [("ffn_gate_exps", (E, I, H)), ("ffn_up_exps", (E, I, H)), ("ffn_down_exps", (E, H, I))]:
        data = gguf.quants.quantize(rand(*shape), qt)
        gguf.quants.dequantize(data, qt).astype(np.float32).reshape(shape).tofile(os.path.join(d, f"{name}.f32"))
        w.add_tensor(f"blk.0.{name}.weight", data, raw_dtype=qt)
        index["cases"].append({"layout": "gguf", "name": name, "shape": list(shape), "format": qt.name})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # HF: one tensor per expert.
    d = os.path.join(root, "hf")
    os.makedirs(d, exist_ok=True)
    tensors, bf = {}, set()
    for proj, shape in [("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))]:
        deq = np.zeros((E,) + shape, np.float32)
        for e in range(E):
            xb = mx.array(rand(*shape)).astype(mx.bfloat16)
            name = f"model.layers.0.mlp.experts.{e}.{proj}.weight"
            tensors[name] = np.array(xb.view(mx.uint16)).view(np.uint16)
            bf.add(name)
            deq[e] = np.array(xb.astype(mx.float32))
        deq.tofile(os.path.join(d, f"{proj}.f32"))
        index["cases"].append({"layout": "hf", "name": proj, "shape": [E] + list(shape)})
    write_safetensors(os.path.join(d, "model.safetensors"), tensors, bf16=bf)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3_moe"}, f)

    # Gemma 4 (HF): experts.gate_up_proj [E, 2·I, H], gate the first I rows of each expert (mlx-lm's
    # sanitize splits it so), experts.down_proj [E, H, I].
    d = os.path.join(root, "gemma4")
    os.makedirs(d, exist_ok=True)
    gu = mx.array(rand(E, 2 * I, H)).astype(mx.bfloat16)
    dn = mx.array(rand(E, H, I)).astype(mx.bfloat16)
    gate, up = mx.split(gu, 2, axis=-2)
    tensors = {"model.layers.0.experts.gate_up_proj": np.array(gu.view(mx.uint16)).view(np.uint16),
               "model.layers.0.experts.down_proj": np.array(dn.view(mx.uint16)).view(np.uint16)}
    write_safetensors(os.path.join(d, "model.safetensors"), tensors, bf16=set(tensors))
    for proj, a in (("gate_proj", gate), ("up_proj", up), ("down_proj", dn)):
        np.array(a.astype(mx.float32)).tofile(os.path.join(d, f"{proj}.f32"))
        index["cases"].append({"layout": "gemma4", "name": proj, "shape": list(a.shape)})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "gemma4_text"}, f)

    with open(os.path.join(root, "index.json"), "w") as f:
        json.dump(index, f)
    print(f"moe_experts: {len(index['cases'])} matrices in {root}")


def write_safetensors(path, tensors, bf16=()):
    """safetensors' layout (8-byte header length, JSON header, data), with uint16 arrays named in
    `bf16` declared BF16 — the numpy writer has no bfloat16."""
    dtypes = {np.dtype(np.float32): "F32", np.dtype(np.uint32): "U32", np.dtype(np.float16): "F16",
              np.dtype(np.uint16): "U16", np.dtype(np.uint8): "U8"}
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        dt = "BF16" if name in bf16 else dtypes[a.dtype]
        b = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


if __name__ == "__main__":
    main()
