"""What the GGUF writers of the model fixtures share (qwen3_moe_reference.py, qwen3_5_reference.py,
qwen3_next_reference.py, gpt_oss_reference.py, gemma3_reference.py), written once: the synthetic SPM
vocabulary llama.cpp's tools need and the texts of it, llama.cpp's tensor names, its
hyper-parameter keys of a transformer, its experts and its gated-DeltaNet layers (gguf-py's
GGUFWriter, the converter's key names), Q8_0 tensors that return the values they hold (the
oracle's input), and the file's final write.

Keys are written in the order the caller calls these in; a GGUF's bytes (and the sha256 a golden
records) depend on it.
"""
import numpy as np

FIRST_CHAR = 0x4E00


def vocab(V):
    """SPM: <unk> <s> </s>, then one CJK character per id; no merges are possible (every token is
    one character), so a text of those characters tokenizes to exactly its ids."""
    return ["<unk>", "<s>", "</s>"] + [chr(FIRST_CHAR + i) for i in range(V - 3)]


def text_of(ids):
    assert all(3 <= t for t in ids)
    return "".join(chr(FIRST_CHAR + t - 3) for t in ids)


def write_spm_vocab(wr, c, ids=True):
    """The synthetic SPM vocabulary (vocab()) as GGUF tokenizer metadata (ids: with the BOS/EOS
    ids, where the caller has not written them)."""
    import gguf
    toks = vocab(c["vocab_size"])
    wr.add_tokenizer_model("llama")
    wr.add_token_list(toks)
    wr.add_token_scores([0.0] * len(toks))
    wr.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] +
                       [gguf.TokenType.NORMAL] * (len(toks) - 3))
    wr.add_unk_token_id(0)
    if ids:
        wr.add_bos_token_id(c["bos_token_id"])
        wr.add_eos_token_id(c["eos_token_id"])
    wr.add_add_bos_token(True)
    wr.add_add_space_prefix(False)


# llama.cpp's names of the tensors outside the blocks (gguf-py TensorNameMap, every arch).
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def gguf_namer(block_names):
    """The HF → GGUF tensor-name map of one arch: TOP_NAMES, else model.layers.N.<rest> →
    blk.N.<rest> with the first matching (HF prefix, GGUF prefix) pair of `block_names` (the
    arch's gguf-py TensorNameMap entries) substituted."""
    def gguf_name(hf):
        if hf in TOP_NAMES:
            return TOP_NAMES[hf]
        parts = hf.split(".")
        l, rest = parts[2], ".".join(parts[3:])
        for a, b in block_names:
            if rest.startswith(a):
                return f"blk.{l}.{b}{rest[len(a):]}"
        raise KeyError(hf)
    return gguf_name


def add_transformer(wr, c, rope_theta, rope_dims=None, rope_sections=None):
    """The shared transformer keys of an HF config `c` (rope_dims: the rotated dims where RoPE is
    partial; rope_sections: mrope's, for qwen35)."""
    wr.add_block_count(c["num_hidden_layers"])
    wr.add_context_length(c["max_position_embeddings"])
    wr.add_embedding_length(c["hidden_size"])
    wr.add_feed_forward_length(c["intermediate_size"])
    wr.add_head_count(c["num_attention_heads"])
    wr.add_head_count_kv(c["num_key_value_heads"])
    wr.add_key_length(c["head_dim"])
    wr.add_value_length(c["head_dim"])
    wr.add_rope_freq_base(rope_theta)
    if rope_dims is not None:
        wr.add_rope_dimension_count(rope_dims)
    if rope_sections is not None:
        wr.add_rope_dimension_sections(rope_sections)
    wr.add_layer_norm_rms_eps(c["rms_norm_eps"])


def add_experts(wr, c, shared=False):
    wr.add_expert_count(c["num_experts"])
    wr.add_expert_used_count(c["num_experts_per_tok"])
    wr.add_expert_feed_forward_length(c["moe_intermediate_size"])
    if shared:
        wr.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])


def add_gated_delta(wr, c):
    """The gated-DeltaNet shapes as the converter writes them (Qwen3NextModel, Qwen3_5TextModel)."""
    wr.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    wr.add_ssm_state_size(c["linear_key_head_dim"])
    wr.add_ssm_group_count(c["linear_num_key_heads"])
    wr.add_ssm_time_step_rank(c["linear_num_value_heads"])
    wr.add_ssm_inner_size(c["linear_num_value_heads"] * c["linear_value_head_dim"])
    wr.add_full_attention_interval(c["full_attention_interval"])


def q8_0(wr, name, w):
    """Adds `w` as a Q8_0 tensor (gguf-py's quantizer, ggml's bytes); returns the values it holds."""
    import gguf
    qt = gguf.GGMLQuantizationType.Q8_0
    q = gguf.quants.quantize(w, qt)
    wr.add_tensor(name, q, raw_dtype=qt)
    return gguf.quants.dequantize(q, qt).reshape(w.shape).astype(np.float32)


def finish(wr):
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
