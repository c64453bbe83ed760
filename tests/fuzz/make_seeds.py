#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/ (committed; rerun
to regenerate). Inputs are small and real-looking: HTTP requests as clients send them, API bodies
as the openai/anthropic/ollama clients send them, GGUF and safetensors files written by the `gguf`
and `safetensors` packages, the real chat templates, text for real tokenizers, LKV1 files written
by `larder generate --ssd-cache`, JSON schemas and GBNF grammars, model output in the harmony,
thinking-tag and tool-call formats. Run with the project's .venv:

    .venv/bin/python tests/fuzz/make_seeds.py [--larder build/bin/larder]
"""
import argparse
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.environ.get("LARDER_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
STORIES = os.path.join(SHARED, "models/stories260K/stories260K.gguf")


def put(target, data, name=None):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    name = name or hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def http_seeds():
    def req(method, path, body=None, headers=(), version="HTTP/1.1"):
        h = [f"{method} {path} {version}", "Host: 127.0.0.1:8080"] if version == "HTTP/1.1" else [f"{method} {path} {version}"]
        h += list(headers)
        if body is not None:
            b = body if isinstance(body, str) else json.dumps(body)
            h += ["Content-Type: application/json", f"Content-Length: {len(b.encode())}"]
            return "\r\n".join(h) + "\r\n\r\n" + b
        return "\r\n".join(h) + "\r\n\r\n"

    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
    put("http", req("GET", "/health"), "health")
    put("http", req("GET", "/v1/models", headers=["Accept: */*", "User-Agent: OpenAI/Python 1.50.0"]), "models")
    put("http", req("POST", "/v1/chat/completions", chat), "chat")
    put("http", req("POST", "/v1/chat/completions", dict(chat, stream=True, stream_options={"include_usage": True})), "chat_stream")
    put("http", req("POST", "/v1/completions", {"prompt": "Once upon", "max_tokens": 2}), "completions")
    put("http", req("POST", "/v1/messages", {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                    headers=["x-api-key: k", "anthropic-version: 2023-06-01"]), "messages")
    put("http", req("POST", "/api/chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False,
                                          "options": {"num_predict": 2}}), "ollama_chat")
    put("http", req("POST", "/completion", {"prompt": "abc", "n_predict": 2}), "native")
    put("http", req("POST", "/tokenize", {"content": "hello world", "with_pieces": True}), "tokenize")
    put("http", req("POST", "/apply-template", {"messages": [{"role": "user", "content": "x"}]}), "apply_template")
    put("http", req("POST", "/v1/kv/lookup", {"prompt": "Once upon a time"}), "kv_lookup")
    put("http", req("OPTIONS", "/v1/chat/completions", headers=["Origin: http://localhost:3000",
                    "Access-Control-Request-Method: POST", "Access-Control-Request-Headers: content-type"]), "preflight")
    put("http", req("GET", "/", headers=["Accept: text/html"]), "webui")
    put("http", req("GET", "/metrics?x=1&y=%20"), "metrics")
    put("http", req("GET", "/health", version="HTTP/1.0"), "http10")
    put("http", req("GET", "/health", version="HTTP/1.0") .replace("\r\n\r\n", "\r\nConnection: keep-alive\r\n\r\n"), "http10_keepalive")
    # Pipelined: three requests in one write.
    put("http", req("GET", "/health") + req("POST", "/v1/completions", {"prompt": "a", "max_tokens": 1}) + req("GET", "/v1/models"),
        "pipelined")
    # Chunked body with an extension and a trailer.
    body = json.dumps({"prompt": "The sea", "max_tokens": 1})
    chunks = f"{len(body[:10]):x};ext=1\r\n{body[:10]}\r\n{len(body[10:]):x}\r\n{body[10:]}\r\n0\r\nX-Trailer: 1\r\n\r\n"
    put("http", "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n" + chunks, "chunked")
    put("http", "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n" + body, "expect_continue")
    put("http", "GET /health HTTP/1.1\nHost: x\n\n", "bare_lf")
    put("http", "GET http://127.0.0.1:8080/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "absolute_form")
    # Forms the transport refuses (smuggling, bad framing): keep them, the error paths are code too.
    put("http", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "cl_te")
    put("http", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", "two_cl")
    put("http", "GET /health HTTP/2.0\r\nHost: x\r\n\r\n", "http2")


def api_seeds():
    routes = {"chat": 0, "completions": 1, "messages": 2, "ollama_chat": 3, "ollama_generate": 4, "apply_template": 5,
              "kv_lookup": 6}
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    bodies = {
        "chat": [
            {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
             "max_tokens": 2, "temperature": 0},
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stream": True,
             "stream_options": {"include_usage": True}, "stop": ["x", "yz"], "top_p": 0.9, "top_k": 5, "min_p": 0.1,
             "seed": 3, "logprobs": True, "top_logprobs": 2, "logit_bias": {"5": 1.5}, "n": 2},
            {"messages": [{"role": "user", "content": "weather?"},
                          {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                           "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                          {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
             "tools": [weather], "tool_choice": "required", "max_tokens": 8},
            {"messages": [{"role": "user", "content": "json"}], "max_tokens": 8,
             "response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": {
                 "type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}}, "required": ["a"]}}}},
            {"messages": [{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}],
             "response_format": {"type": "json_object"}, "chat_template_kwargs": {"enable_thinking": False},
             "reasoning_effort": "low", "max_completion_tokens": 3, "cache_salt": "s1"},
            {"messages": [{"role": "user", "content": "g"}], "grammar": "root ::= (\"yes\" | \"no\") \".\"", "max_tokens": 4},
        ],
        "completions": [
            {"model": "m", "prompt": "Once upon a time", "max_tokens": 2, "temperature": 0},
            {"prompt": ["The sea", "A cat"], "max_tokens": 2, "logprobs": 2, "echo": False, "stop": "x", "seed": 9},
            {"prompt": [1, 2, 3, 4], "max_tokens": 1, "top_k": 3, "best_of": 1, "n": 1},
            {"prompt": "abc", "n_predict": 3, "json_schema": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
             "repeat_penalty": 1.1, "ignore_eos": True, "n_probs": 2, "cache_prompt": True},
            {"prompt": "x", "grammar": "root ::= [a-z]+ \"!\"", "max_tokens": 4, "presence_penalty": 0.5,
             "frequency_penalty": 0.2, "suffix": None},
        ],
        "messages": [
            {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
            {"max_tokens": 2, "system": [{"type": "text", "text": "sys"}], "stream": True, "stop_sequences": ["q"],
             "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]},
                          {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}],
             "temperature": 0.5, "top_p": 0.9, "top_k": 4, "metadata": {"user_id": "x"}},
            {"max_tokens": 16, "messages": [{"role": "user", "content": "weather"},
                                            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                             "name": "get_weather", "input": {"city": "Oslo"}}]},
                                            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                             "content": "sunny"}]}],
             "tools": [{"name": "get_weather", "description": "w", "input_schema": weather["function"]["parameters"]}],
             "tool_choice": {"type": "tool", "name": "get_weather"}, "thinking": {"type": "enabled", "budget_tokens": 1024}},
        ],
        "ollama_chat": [
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False,
             "options": {"num_predict": 2, "temperature": 0, "top_k": 3, "stop": ["\n"], "seed": 1, "num_ctx": 64}},
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "format": "json", "keep_alive": "5m"},
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [weather],
             "format": {"type": "object", "properties": {"a": {"type": "string"}}}, "think": False},
            {"model": "m", "messages": []},
        ],
        "ollama_generate": [
            {"model": "m", "prompt": "Once", "stream": False, "options": {"num_predict": 2}},
            {"model": "m", "prompt": "x", "system": "s", "template": "{{ .Prompt }}", "raw": True, "context": [1, 2, 3]},
            {"model": "m", "prompt": "", "keep_alive": 0},
        ],
        "apply_template": [
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "tools": [weather],
             "chat_template_kwargs": {"enable_thinking": True}, "add_generation_prompt": True},
        ],
        "kv_lookup": [
            {"model": "stories260K", "prompt": "Once upon a time"},
            {"tokens": [1, 403, 407, 261, 378], "cache_salt": "s1"},
            {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
             "tools": [weather], "max_tokens": 4},
        ],
    }
    for route, items in bodies.items():
        for i, b in enumerate(items):
            put("api", bytes([routes[route]]) + json.dumps(b).encode(), f"{route}_{i}")


def gguf_seeds():
    import gguf

    def write(name, fill):
        tmp = tempfile.NamedTemporaryFile(suffix=".gguf", delete=False)
        tmp.close()
        w = gguf.GGUFWriter(tmp.name, "llama")
        fill(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(tmp.name, "rb") as f:
            put("gguf", f.read(), name)
        os.unlink(tmp.name)

    def small_llama(w):
        w.add_name("fuzz-llama")
        w.add_context_length(64)
        w.add_embedding_length(8)
        w.add_block_count(1)
        w.add_feed_forward_length(16)
        w.add_head_count(2)
        w.add_head_count_kv(1)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(4)] + ["▁a", "▁b", "ab", "▁", "a", "b"]
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_scores([0.0] * 3 + [0.0] * 4 + [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0])
        w.add_token_types([2, 3, 3] + [6] * 4 + [1] * 6)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
        w.add_tensor("token_embd.weight", np.arange(13 * 8, dtype=np.float32).reshape(13, 8))
        w.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float16))
        q = np.zeros((2, 34), dtype=np.uint8)  # two Q8_0 blocks of 32 (f16 scale + 32 int8)
        w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def gpt2_vocab(w):
        w.add_name("fuzz-gpt2")
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        toks = ["a", "b", "c", "Ġ", "Ġa", "ab", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        w.add_token_list(toks)
        w.add_token_types([1] * 6 + [3] * 3)
        w.add_token_merges(["Ġ a", "a b"])
        w.add_eos_token_id(6)
        w.add_array("fuzz.floats", [1.5, 2.5])
        w.add_array("fuzz.ints", [1, -2, 3])
        w.add_bool("fuzz.flag", True)
        w.add_uint64("fuzz.u64", 1 << 40)
        w.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))

    write("llama_q8", small_llama)
    write("gpt2_vocab", gpt2_vocab)
    # The first KiB of a real file (header and the start of the metadata): truncated on purpose.
    with open(STORIES, "rb") as f:
        put("gguf", f.read(1024), "stories260K_head")


def safetensors_seeds():
    from safetensors.numpy import save

    put("safetensors", save({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, dtype=np.float16)},
                            metadata={"format": "pt"}), "f32_f16")
    put("safetensors", save({"w": np.zeros((4, 2), dtype=np.uint32), "w.scales": np.ones((4, 1), dtype=np.float16),
                             "w.biases": np.zeros((4, 1), dtype=np.float16)}, metadata={"format": "mlx"}), "mlx_affine")
    put("safetensors", save({"i": np.array([1, 2], dtype=np.int64), "e": np.zeros((0, 3), dtype=np.int8)}), "int_empty")
    # BF16 (numpy has no bfloat16): the header written by hand, as safetensors lays it out.
    hdr = json.dumps({"x": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
                      "__metadata__": {"format": "mlx"}}, separators=(",", ":")).encode()
    hdr += b" " * (-len(hdr) % 8)
    put("safetensors", struct.pack("<Q", len(hdr)) + hdr + bytes(range(8)), "bf16")


def chat_template_seeds():
    d = os.path.join(SHARED, "chat-templates")
    for n in sorted(os.listdir(d)):
        if n.endswith(".jinja"):
            with open(os.path.join(d, n), "rb") as f:
                put("chat_template", f.read(), n[: -len(".jinja")])
    for n in sorted(os.listdir(os.path.join(ROOT, "src/larder/runtime/chat_templates"))):
        with open(os.path.join(ROOT, "src/larder/runtime/chat_templates", n), "rb") as f:
            put("chat_template", f.read(), "builtin_" + n.split(".")[0])


def tokenizer_seeds():
    texts = [
        "Hello world! How are you doing today?",
        "  leading spaces\tand\ttabs\n\nnew lines  ",
        "numbers 1234567 and 3.14159, dates 2026-12-07",
        "Ünïcödé — naïve café, 日本語のテキスト, 한국어, emoji 🦙🔥, Ελληνικά",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<s>[INST] question [/INST] answer</s>",
        "def f(x):\n    return x ** 2  # comment\n",
        "I'm you're they'll we've she'd CAPS'LL",
        b"\xff\xfe invalid utf8 \xc3\x28 \xe2\x82 \xf0\x9f",
    ]
    with open(os.path.join(SHARED, "corpora/tinyshakespeare.txt"), "rb") as f:
        shakespeare = f.read(600)
    for t, text in enumerate(texts + [shakespeare]):
        raw = text if isinstance(text, bytes) else text.encode()
        for which in range(3):
            put("tokenizer", bytes([which, t & 1]) + raw, f"t{t}_{which}")


def grammar_seeds():
    with open(os.path.join(ROOT, "tests/server/grammar_schemas.json")) as f:
        schemas = json.load(f)
    for i, s in enumerate(schemas["valid"][:20]):
        put("grammar", bytes([i % 2]) + json.dumps(s).encode(), f"schema_{i}")
    for i, (s, _) in enumerate(schemas["refused"][:4]):
        put("grammar", b"\x00" + json.dumps(s).encode(), f"refused_{i}")
    gbnf = [
        'root ::= " " ("yes" | "no") "."',
        'root ::= item+\nitem ::= "- " [a-z0-9 ]{1,10} "\\n"',
        'root ::= object\nobject ::= "{" ws (pair ("," ws pair)*)? "}"\npair ::= string ":" ws value\n'
        'value ::= string | number | object\nstring ::= "\\"" [^"\\\\]* "\\""\nnumber ::= "-"? [0-9]+ ("." [0-9]+)?\nws ::= [ \\t\\n]*',
        'root ::= (expr "=" term "\\n")+\nexpr ::= term ([-+*/] term)*\nterm ::= [0-9]+',
        'root ::= [^\\x00-\\x1f]* "\\u00e9" [\\U0001F600-\\U0001F64F]?',
    ]
    for i, g in enumerate(gbnf):
        put("grammar", b"\x02" + g.encode(), f"gbnf_{i}")
    tag = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [
        {"begin": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ", "content": {"type": "json_schema", "json_schema": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}, "end": "}\n</tool_call>"}],
        "at_least_one": False, "stop_after_first": False}}
    put("grammar", b"\x03" + json.dumps(tag).encode(), "structural_tag")


def output_seeds():
    # fuzz_output.cpp's layout: byte 0 the pipeline (bit 0 harmony; else bit 1 reasoning
    # splitter, bit 2 start inside, bits 3-4 tool-call style 0 none, 1 tagged, 2 bare JSON,
    # 3 tagged XML), byte 1 a count k, k piece lengths, then the text.
    def out(name, mode, text, lengths=(1, 3, 7, 2, 11, 5)):
        put("output", bytes([mode, len(lengths)]) + bytes(lengths) + text.encode(), name)

    harmony = [
        ("harmony_final", "<|channel|>analysis<|message|>The user greets.<|end|>"
                          "<|start|>assistant<|channel|>final<|message|>Hello there!<|return|>"),
        ("harmony_call", "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
                         "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>"),
        ("harmony_recipient_first", "<|start|>assistant to=functions.run_code<|channel|>commentary json<|message|>"
                                    "{\"code\": \"print(1)\"}<|call|>"),
        ("harmony_preamble", "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>final"
                             "<|message|>Done<|end|>"),
        ("harmony_no_end", "<|channel|>analysis<|message|>thinking<|start|>assistant<|channel|>final<|message|>answer"),
        ("harmony_plain", "Just a plain answer with no harmony header at all, " * 6),
        ("harmony_bad_args", "<|channel|>commentary to=functions.f<|message|>not json<|call|>"),
    ]
    for name, text in harmony:
        out(name, 1, text)
    reasoning = [
        ("think", 2, "<think>\nLet me think.\n</think>\n\nThe answer is 4."),
        ("think_inside", 6, "still thinking</think>\r\n\nanswer"),
        ("think_unclosed", 2, "<think>never closes <thi"),
        ("think_tool", 2 | 8, "<think>call it</think>\n<tool_call>\n{\"name\": \"get_weather\", "
                               "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"),
    ]
    for name, mode, text in reasoning:
        out(name, mode, text)
    tools = [
        ("tagged", 8, "Sure. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
                      "</tool_call><tool_call>{\"name\": \"run_code\", \"arguments\": \"{\\\"code\\\": 1}\"}</tool_call>"),
        ("tagged_bad", 8, "a <tool_call>not a call</tool_call> b <tool_call>{\"name\": 1}</tool_call> <tool_ca"),
        ("tagged_eos", 8, "<tool_call>{\"name\": \"f\", \"parameters\": {}}"),
        ("bare_json", 16, "  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}"),
        ("bare_list", 16, "[{\"name\": \"a\"}, {\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}]"),
        ("python_tag", 16, "<|python_tag|>{\"name\": \"run_code\", \"parameters\": {\"code\": \"x\"}}"),
        ("bare_text", 16, "   plain text answer, not a call"),
        ("xml", 24, "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
                    "<parameter=days>\n 3 \n</parameter>\n<parameter=unit>\nf\n</parameter>\n<parameter=mode>\nfast\n"
                    "</parameter>\n<parameter=opts>\n{\"a\": true}\n</parameter>\n</function>\n</tool_call>"),
        ("xml_code", 24, "<tool_call>\n<function=run_code>\n<parameter=code>\ndef f():\n\n    return 1\n</parameter>\n"
                         "</function>"),
        ("xml_bad", 24, "<tool_call><function=>\n</function></tool_call><tool_call><function=g><parameter=x>1"),
    ]
    for name, mode, text in tools:
        out(name, mode, text)
    out("byte_by_byte", 2 | 24, "<think>x</think><tool_call><function=f><parameter=a>1</parameter></function></tool_call>",
        lengths=(1,) * 80)
    out("empty_pushes", 1, "<|channel|>final<|message|>hi<|return|>", lengths=(0, 5, 0, 0, 9, 0))


def lkv_seeds(larder):
    if not larder or not os.path.exists(larder):
        print("make_seeds: no larder binary, LKV1 seeds not regenerated (--larder build/bin/larder)", file=sys.stderr)
        return
    tmp = tempfile.mkdtemp(prefix="larder-fuzz-seeds-")
    try:
        for prompt, kv in [("Once upon a time", "f16"), ("The cat sat", "f32"), ("A", "f16")]:
            # Relative model path: the header's model_label is the path as given.
            subprocess.run([os.path.abspath(larder), "generate", os.path.basename(STORIES), "--prompt", prompt, "-n", "2",
                            "--kv-dtype", kv, "--ssd-cache", tmp], check=True, capture_output=True,
                           cwd=os.path.dirname(STORIES))
        n = 0
        for dirpath, _, files in os.walk(tmp):
            for fn in sorted(files):
                if fn.endswith(".lkv"):
                    with open(os.path.join(dirpath, fn), "rb") as f:
                        raw = f.read()
                    # fuzz_lkv.cpp's input modes: 0 as is, 1 prefix checksums fixed up, 2 header
                    # JSON + NUL + data section (the harness lays the file out and checksums it).
                    header_len, data_off = struct.unpack_from("<IQ", raw, 12)
                    put("lkv", b"\x00" + raw, f"raw_{n}")
                    put("lkv", b"\x01" + raw, f"prefix_fixed_{n}")
                    put("lkv", b"\x02" + raw[48:48 + header_len] + b"\x00" + raw[data_off:], f"structured_{n}")
                    n += 1
        print(f"make_seeds: {n} LKV1 files", file=sys.stderr)
    finally:
        shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--larder", default=os.path.join(ROOT, "build/bin/larder"))
    args = ap.parse_args()
    http_seeds()
    api_seeds()
    gguf_seeds()
    safetensors_seeds()
    chat_template_seeds()
    tokenizer_seeds()
    grammar_seeds()
    output_seeds()
    lkv_seeds(args.larder)


if __name__ == "__main__":
    main()
