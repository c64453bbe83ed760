#!/usr/bin/env python3
"""Oracle A for stories260K: an independent numpy port of llama2.c's run.c forward pass.

Reads llama2.c's original checkpoint format (stories260K.bin) — not the GGUF larder loads — and
writes the greedy token ids run.c would produce to <out>/llama2c/stories260K_greedy.json:
  {"bos": [1, t1, ... t200], "prompt": [1, 403, 407, 261, 378, ...]}   (200 positions each)

Oracle B (cross-check, run here): llama2.c's test_all.py documents the 200-token greedy text from
BOS; the ids from oracle A, decoded with tok512.bin the way run.c decodes, must reproduce it.

Checkpoint format (run.c read_checkpoint): 7 int32 header
  dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
(negative vocab_size: the classifier is not shared with the embedding), then float32 tensors in
this order: token_embedding [vocab, dim], rms_att [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim],
wv [L, kv_dim, dim], wo [L, dim, dim], rms_ffn [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden],
w3 [L, hidden, dim], rms_final [dim], two legacy RoPE tables [seq_len, head_size/2] (skipped),
then wcls [vocab, dim] if unshared. Matrices are [out, in] (run.c matmul: W(d,n) @ x(n)).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

# llama2.c test_all.py, expected_stdout (run.c -t 0.0 -n 200 on stories260K.bin with tok512.bin).
EXPECTED_TEXT = (
    'Once upon a time, there was a little girl named Lily. She loved to play outside in the park. '
    'One day, she saw a big, red ball. She wanted to play with it, but it was too high.\n'
    'Lily\'s mom said, "Lily, let\'s go to the park." Lily was sad and didn\'t know what to do. '
    'She said, "I want to play with your ball, but I can\'t find it."\n'
    'Lily was sad and didn\'t know what to do. She said, "I\'m sorry, Lily. I didn\'t know what to do."\n'
    'Lily didn\'t want to help her mom, so she'
)

PROMPT = [1, 403, 407, 261, 378]  # BOS + "Once upon a time"
STEPS = 200


def load_checkpoint(path):
    with open(path, "rb") as f:
        data = f.read()
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = struct.unpack("7i", data[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    head = dim // n_heads
    kv_dim = n_kv_heads * head
    buf = np.frombuffer(data, dtype=np.float32, offset=28)
    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        a = buf[pos:pos + n].reshape(shape)
        pos += n
        return a

    w = {}
    w["emb"] = take(vocab, dim)
    w["rms_att"] = take(n_layers, dim)
    w["wq"] = take(n_layers, dim, dim)
    w["wk"] = take(n_layers, kv_dim, dim)
    w["wv"] = take(n_layers, kv_dim, dim)
    w["wo"] = take(n_layers, dim, dim)
    w["rms_ffn"] = take(n_layers, dim)
    w["w1"] = take(n_layers, hidden, dim)
    w["w2"] = take(n_layers, dim, hidden)
    w["w3"] = take(n_layers, hidden, dim)
    w["rms_final"] = take(dim)
    take(seq_len, head // 2)  # freq_cis_real (unused by run.c)
    take(seq_len, head // 2)  # freq_cis_imag
    w["wcls"] = w["emb"] if shared else take(vocab, dim)
    cfg = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
               vocab=vocab, seq_len=seq_len, head=head, kv_dim=kv_dim)
    return cfg, w


def rmsnorm(x, g):
    ss = np.float32(np.mean(x * x, dtype=np.float32)) + np.float32(1e-5)
    return (g * (x * (np.float32(1.0) / np.sqrt(ss)))).astype(np.float32)


class Transformer:
    def __init__(self, cfg, w):
        self.c, self.w = cfg, w
        L, S, kvd = cfg["n_layers"], cfg["seq_len"], cfg["kv_dim"]
        self.kc = np.zeros((L, S, kvd), np.float32)
        self.vc = np.zeros((L, S, kvd), np.float32)

    def forward(self, token, pos):
        c, w = self.c, self.w
        dim, hs, kvd = c["dim"], c["head"], c["kv_dim"]
        kv_mul = c["n_heads"] // c["n_kv_heads"]
        x = w["emb"][token].copy()
        for l in range(c["n_layers"]):
            xb = rmsnorm(x, w["rms_att"][l])
            q = w["wq"][l] @ xb
            k = w["wk"][l] @ xb
            v = w["wv"][l] @ xb
            # run.c RoPE: adjacent pairs (i, i+1); frequency from the index within the head.
            for i in range(0, dim, 2):
                hd = i % hs
                freq = np.float32(1.0) / np.power(np.float32(10000.0), np.float32(hd) / np.float32(hs))
                val = np.float32(pos) * freq
                fcr, fci = np.float32(np.cos(val)), np.float32(np.sin(val))
                vecs = (q, k) if i < kvd else (q,)
                for vec in vecs:
                    v0, v1 = vec[i], vec[i + 1]
                    vec[i] = v0 * fcr - v1 * fci
                    vec[i + 1] = v0 * fci + v1 * fcr
            self.kc[l, pos] = k
            self.vc[l, pos] = v
            out = np.zeros(dim, np.float32)
            for h in range(c["n_heads"]):
                qh = q[h * hs:(h + 1) * hs]
                kvh = h // kv_mul
                keys = self.kc[l, :pos + 1, kvh * hs:(kvh + 1) * hs]
                vals = self.vc[l, :pos + 1, kvh * hs:(kvh + 1) * hs]
                att = (keys @ qh) / np.sqrt(np.float32(hs))
                att = np.exp(att - att.max())
                att = att / att.sum()
                out[h * hs:(h + 1) * hs] = att @ vals
            x = x + w["wo"][l] @ out
            xb = rmsnorm(x, w["rms_ffn"][l])
            hb = w["w1"][l] @ xb
            hb2 = w["w3"][l] @ xb
            hb = hb * (np.float32(1.0) / (np.float32(1.0) + np.exp(-hb))) * hb2
            x = x + w["w2"][l] @ hb
        x = rmsnorm(x, w["rms_final"])
        return w["wcls"] @ x


def generate(cfg, w, prompt, steps):
    """run.c generate(): force the prompt, then greedy until `steps` positions (or BOS)."""
    t = Transformer(cfg, w)
    seq = [prompt[0]]
    token, pos = prompt[0], 0
    while pos < steps:
        logits = t.forward(token, pos)
        nxt = prompt[pos + 1] if pos < len(prompt) - 1 else int(np.argmax(logits))
        pos += 1
        if nxt == 1:
            break
        seq.append(nxt)
        token = nxt
    return seq


def load_vocab(path, vocab):
    pieces = []
    with open(path, "rb") as f:
        struct.unpack("i", f.read(4))  # max_token_length
        for _ in range(vocab):
            struct.unpack("f", f.read(4))
            (n,) = struct.unpack("i", f.read(4))
            pieces.append(f.read(n))
    return pieces


def decode(pieces, seq):
    """run.c decode() + safe_printf: strip the space after BOS, <0xXX> byte pieces, skip
    unprintable single bytes."""
    out = bytearray()
    for prev, tok in zip(seq, seq[1:]):
        p = pieces[tok]
        if prev == 1 and p.startswith(b" "):
            p = p[1:]
        if len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">"):
            p = bytes([int(p[3:5], 16)])
        if len(p) == 1 and not (chr(p[0]).isprintable() or chr(p[0]).isspace()):
            continue
        out += p
    return out.decode("utf-8", errors="replace")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", required=True)
    a = ap.parse_args()
    d = os.path.join(a.shared, "models", "stories260K")
    cfg, w = load_checkpoint(os.path.join(d, "stories260K.bin"))
    bos = generate(cfg, w, [1], STEPS)
    prompt = generate(cfg, w, PROMPT, STEPS)
    pieces = load_vocab(os.path.join(d, "tok512.bin"), cfg["vocab"])
    text = decode(pieces, bos)
    if text != EXPECTED_TEXT:
        print("llama2c_reference: numpy port disagrees with llama2.c's documented output", file=sys.stderr)
        print("got:\n" + text, file=sys.stderr)
        return 1
    if not decode(pieces, prompt).startswith("Once upon a time"):
        print("llama2c_reference: prompt run does not start with the prompt", file=sys.stderr)
        return 1
    os.makedirs(os.path.join(a.out, "llama2c"), exist_ok=True)
    with open(os.path.join(a.out, "llama2c", "stories260K_greedy.json"), "w") as f:
        json.dump({"config": cfg, "bos": bos, "prompt": prompt, "bos_text": text}, f)
    print(f"llama2c_reference: {len(bos)} + {len(prompt)} ids; text matches test_all.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
