"""Black-box tests of `larder serve` (issue 5, ../shared/design/server-api.md): a live server on
loopback, driven through the official openai and anthropic clients and raw HTTP. Models: the real
stories260K (completions; no chat template) and a seeded random-weight Llama with the Llama 3
chat template made at test time (tiny_model.py). Greedy outputs are never hard-coded: they are
cross-checked against `larder generate`, against each other (stream vs non-stream, alone vs
batched, cached vs cold) and against the first response of the same request.

Run by CTest (`ctest -L server`), or by hand from this folder:
    LARDER_BIN=../../build/bin/larder ../../.venv/bin/python -m unittest -v server_test fuzz_test
(LARDER_BIN and LARDER_SHARED_DIR default to ../../build/bin/larder and ../../../shared.)"""
import http.client
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

from server_harness import (BIN, CHAT_MODEL_NAME, STORIES, STORIES_PROMPT, STORIES_PROMPT_IDS,
                            Server, ServerTestCase, anthropic_events, chat_model, generate,
                            metric_sum, openai_chunks, parse_sse, run_cli, tmp_root)

ID_RE = {"chat": re.compile(r"^chatcmpl-[A-Za-z0-9]{24}$"), "cmpl": re.compile(r"^cmpl-[A-Za-z0-9]{24}$"),
         "msg": re.compile(r"^msg_[A-Za-z0-9]{24}$")}
CACHE_HDR = re.compile(r"tier=(ram|ssd|remote|none); *reused=\d+; *reason=\S+")
LONG_TEXT = ("The committee met on a grey morning to review the harvest ledger, the state of the "
             "northern road, and the price of salt in the lower market. ")


def user(text):
    return [{"role": "user", "content": text}]


def boundary_stop(text, nth_space=3):
    """A stop string that spans a token boundary: two characters before and after a space in the
    middle of `text` (both models here start words with a space, so a space begins a token)."""
    spaces = [i for i, c in enumerate(text) if c == " " and 3 <= i <= len(text) - 4]
    assert len(spaces) > nth_space, f"output too short to pick a stop string from: {text!r}"
    i = spaces[nth_space]
    return text[i - 2:i + 3]


def chat_body(text, max_tokens, **kw):
    b = {"messages": user(text), "max_tokens": max_tokens, "temperature": 0}
    b.update(kw)
    return b


def sampling_to_extra_body(kw):
    """The anthropic 2.16 client takes no temperature/top_p/top_k arguments: send them as body fields."""
    extra = {k: kw.pop(k) for k in ("temperature", "top_p", "top_k") if k in kw}
    if extra:
        kw["extra_body"] = {**kw.get("extra_body", {}), **extra}
    return kw


def a_create(server, api_key=None, **kw):
    client = server.anthropic(api_key=api_key) if api_key else server.anthropic()
    return client.messages.create(**sampling_to_extra_body(kw))


def sse_chat_text(test, chunks):
    """Joined content of chat chunks, checking §5.2 along the way."""
    out, finish = [], []
    test.assertGreaterEqual(len(chunks), 2, f"a chat stream has a role chunk and a final chunk: {chunks}")
    first = chunks[0]
    for i, c in enumerate(chunks):
        test.assertEqual(c["object"], "chat.completion.chunk", f"chunk object: {c}")
        for k in ("id", "created", "model"):
            test.assertEqual(c[k], first[k], f"every chunk carries the same {k}: {c}")
        if not c["choices"]:
            continue
        ch = c["choices"][0]
        test.assertEqual(ch["index"], 0)
        test.assertIn("finish_reason", ch, f"choices[0] must carry finish_reason (null until the end): {c}")
        delta = ch["delta"]
        if i == 0:
            test.assertEqual(delta.get("role"), "assistant", f"first delta carries role assistant: {c}")
            test.assertEqual(delta.get("content"), "", f"first delta is {{role, content: ''}}: {c}")
        else:
            test.assertNotIn("role", delta, f"only the first delta carries role: {c}")
            if "content" in delta and delta["content"] is not None and ch["finish_reason"] is None:
                test.assertNotEqual(delta["content"], "", f"content deltas are never empty strings: {c}")
        if delta.get("content"):
            out.append(delta["content"])
        if ch["finish_reason"] is not None:
            finish.append((i, ch["finish_reason"], delta))
    test.assertEqual(len(finish), 1, f"exactly one chunk has a finish_reason; got {finish}")
    test.assertEqual(finish[0][2], {}, f"the final chunk's delta is {{}}: {finish}")
    test.assertTrue(ID_RE["chat"].match(first["id"]), f"chunk id should be chatcmpl- + 24 base62: {first['id']}")
    return "".join(out), finish[0][1], finish[0][0]


def sse_completion_text(test, chunks):
    out, finish = [], []
    first = chunks[0]
    for i, c in enumerate(chunks):
        test.assertEqual(c["object"], "text_completion", f"completion chunk object: {c}")
        test.assertEqual(c["id"], first["id"], "every chunk carries the same id")
        if not c["choices"]:
            continue
        ch = c["choices"][0]
        out.append(ch.get("text") or "")
        if ch.get("finish_reason") is not None:
            finish.append((i, ch["finish_reason"]))
    test.assertEqual(len(finish), 1, f"exactly one chunk has a finish_reason; got {finish}")
    return "".join(out), finish[0][1], finish[0][0]


def check_include_usage(test, chunks, finish_index):
    """§5.2 item 5 with include_usage: usage null on every other chunk, one final choices: [] chunk."""
    usage_chunks = [i for i, c in enumerate(chunks) if c.get("usage")]
    test.assertEqual(usage_chunks, [len(chunks) - 1], f"with include_usage, usage appears only in the last chunk; got it in {usage_chunks} of {len(chunks)}")
    last = chunks[-1]
    test.assertEqual(last["choices"], [], f"the usage chunk has choices: []: {last}")
    test.assertEqual(finish_index, len(chunks) - 2, "the usage chunk follows the finish_reason chunk directly")
    for c in chunks[:-1]:
        test.assertIsNone(c.get("usage"), f"with include_usage every other chunk carries usage: null: {c}")
    u = last["usage"]
    test.assertEqual(u["total_tokens"], u["prompt_tokens"] + u["completion_tokens"], f"total = prompt + completion: {u}")
    return u


def send_large_body(port, path, size, headers=None, timeout=60):
    """POSTs `size` bytes, tolerating a server that answers early and closes. Returns (status, body)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {size}\r\n")
        for k, v in (headers or {}).items():
            head += f"{k}: {v}\r\n"
        s.sendall((head + "\r\n").encode())
        chunk = b'{"messages": "' + b"x" * (1 << 20)
        sent = 0
        # A server may answer from the Content-Length alone: stop sending as soon as a response is
        # readable, so its early close cannot reset the connection before the answer is read.
        early = select.select([s], [], [], 0.3)[0]
        try:
            while sent < size and not early:
                part = chunk[: min(len(chunk), size - sent)]
                s.sendall(part)
                sent += len(part)
                early = select.select([s], [], [], 0)[0]
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                data += b
                if b"\r\n\r\n" in data:
                    hdr, _, rest = data.partition(b"\r\n\r\n")
                    m = re.search(rb"(?i)content-length:\s*(\d+)", hdr)
                    if m and len(rest) >= int(m.group(1)):
                        break
        except (ConnectionResetError, socket.timeout):
            pass
        if not data:
            return None, b""
        status = int(data.split(b" ", 2)[1])
        return status, data.partition(b"\r\n\r\n")[2]
    finally:
        s.close()


# =============================================================================================
class StoriesTest(ServerTestCase):
    """stories260K: /v1/completions, operational routes, errors that need no chat template."""
    FLAGS = ("--parallel", "4")

    def complete(self, prompt=STORIES_PROMPT, n=24, **kw):
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
        body.update(kw)
        r = self.server.post("/v1/completions", body)
        self.assertEqual(r.status, 200, f"/v1/completions should answer 200: {r}")
        return r.json()

    def test_health(self):
        r = self.server.request("GET", "/health")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json().get("status"), "ok", f"/health body is {{status: ok}}: {r}")

    def test_models_list(self):
        client = self.server.openai()
        models = client.models.list().data
        self.assertGreaterEqual(len(models), 1, "the served model must be listed")
        m = models[0]
        self.assertIn("stories260K", m.id, f"served model id comes from the file/directory name: {m.id}")
        self.assertEqual(m.object, "model")
        self.assertEqual(m.owned_by, "larder")
        raw = self.server.request("GET", "/v1/models").json()
        self.assertEqual(raw["object"], "list")
        self.assertIsInstance(raw["data"][0]["created"], int)
        one = self.server.request("GET", "/v1/models/" + m.id)
        self.assertEqual(one.status, 200, f"/v1/models/{{id}} returns the model object: {one}")
        self.assertEqual(one.json().get("id"), m.id)
        self.assertEqual(one.json().get("object"), "model", "/v1/models/{id} is the object, not a list")
        self.assertOpenAIError(self.server.request("GET", "/v1/models/no-such-model"), 404)
        # Responses echo the served id whatever the request's `model` says.
        out = self.complete(model="gpt-4o-mini", n=2)
        self.assertEqual(out["model"], m.id, "responses echo the served model id")

    def test_completion_equals_larder_generate(self):
        for prompt, n in ((STORIES_PROMPT, 40), ("Tom and his dog went to the park", 30)):
            expected = generate(STORIES, prompt, n)
            out = self.complete(prompt, n)
            ch = out["choices"][0]
            self.assertEqual(ch["text"], expected, f"greedy /v1/completions for {prompt!r} must equal `larder generate`")
            if out["usage"]["completion_tokens"] == n:
                self.assertEqual(ch["finish_reason"], "length")
        out = self.complete(STORIES_PROMPT, 10)
        self.assertTrue(ID_RE["cmpl"].match(out["id"]), f"id is cmpl- + 24 base62: {out['id']}")
        self.assertEqual(out["object"], "text_completion")
        self.assertIsInstance(out["created"], int)
        self.assertLess(abs(out["created"] - time.time()), 600, "created is Unix seconds")
        self.assertIn("logprobs", out["choices"][0], "choices[].logprobs is always present (null)")
        self.assertIsNone(out["choices"][0]["logprobs"])
        u = out["usage"]
        self.assertEqual(u["prompt_tokens"], len(STORIES_PROMPT_IDS), f"'{STORIES_PROMPT}' is 5 tokens with BOS: {u}")
        self.assertEqual(u["completion_tokens"], 10, f"max_tokens 10 without EOS: {u}")
        self.assertEqual(u["total_tokens"], u["prompt_tokens"] + u["completion_tokens"])
        # Through the official client too.
        c = self.server.openai().completions.create(model="x", prompt=STORIES_PROMPT, max_tokens=40, temperature=0)
        self.assertEqual(c.choices[0].text, generate(STORIES, STORIES_PROMPT, 40))

    def test_completion_stream_equals_nonstream(self):
        full = self.complete(STORIES_PROMPT, 40)
        r, events = self.server.stream("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 40,
                                                           "temperature": 0, "stream": True})
        self.assertEqual(r.status, 200, f"streamed completion: {r}")
        self.assertTrue(r.headers.get("content-type", "").startswith("text/event-stream"), r.headers)
        chunks = openai_chunks(self, events)
        text, finish, fi = sse_completion_text(self, chunks)
        self.assertEqual(text, full["choices"][0]["text"], "joined stream text must equal the non-stream text")
        self.assertEqual(finish, full["choices"][0]["finish_reason"])
        # Without include_usage larder attaches usage to the final chunk (§5.2 item 5); no choices: [] chunk.
        self.assertTrue(all(c["choices"] for c in chunks), "no choices: [] chunk without include_usage")
        fu = chunks[fi].get("usage") or {}
        self.assertEqual((fu.get("prompt_tokens"), fu.get("completion_tokens")),
                         (full["usage"]["prompt_tokens"], full["usage"]["completion_tokens"]),
                         f"usage rides on the final chunk without include_usage: {chunks[fi]}")
        # The official client parses the same stream.
        s = self.server.openai().completions.create(model="x", prompt=STORIES_PROMPT, max_tokens=40,
                                                    temperature=0, stream=True)
        self.assertEqual("".join(c.choices[0].text for c in s if c.choices), full["choices"][0]["text"])

    def test_completion_include_usage(self):
        r, events = self.server.stream("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 12, "temperature": 0,
                                                           "stream": True, "stream_options": {"include_usage": True}})
        self.assertEqual(r.status, 200, r)
        chunks = openai_chunks(self, events)
        text, finish, fi = sse_completion_text(self, chunks)
        u = check_include_usage(self, chunks, fi)
        self.assertEqual(u["completion_tokens"], 12)
        self.assertEqual(u["prompt_tokens"], 5)
        # stream_options is ignored (not rejected) when stream is false.
        r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 2,
                                                 "stream_options": {"include_usage": True}})
        self.assertEqual(r.status, 200, f"stream_options without stream is ignored: {r}")

    def test_completion_stop_spanning_tokens(self):
        full = self.complete(STORIES_PROMPT, 48)["choices"][0]["text"]
        stop = boundary_stop(full)
        expected = full[:full.index(stop)]
        out = self.complete(STORIES_PROMPT, 48, stop=stop)
        self.assertEqual(out["choices"][0]["text"], expected, f"text must end right before stop {stop!r}")
        self.assertEqual(out["choices"][0]["finish_reason"], "stop")
        r, events = self.server.stream("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 48, "temperature": 0,
                                                           "stream": True, "stop": [stop]})
        chunks = openai_chunks(self, events)
        text, finish, _ = sse_completion_text(self, chunks)
        self.assertEqual(text, expected, f"streamed text must end right before stop {stop!r}; no part of it may be sent")
        self.assertEqual(finish, "stop")

    def test_completion_unfinished_stop_prefix_is_released(self):
        full = self.complete(STORIES_PROMPT, 30)["choices"][0]["text"]
        # A stop string whose beginning is the end of the output: held back while streaming, but at the
        # token limit the pending text must be released.
        stop = full[-3:] + "\u00a7never"
        for stream in (False, True):
            body = {"prompt": STORIES_PROMPT, "max_tokens": 30, "temperature": 0, "stop": stop, "stream": stream}
            if stream:
                r, events = self.server.stream("/v1/completions", body)
                text, finish, _ = sse_completion_text(self, openai_chunks(self, events))
            else:
                out = self.server.post("/v1/completions", body).json()
                text, finish = out["choices"][0]["text"], out["choices"][0]["finish_reason"]
            self.assertEqual(text, full, f"stream={stream}: held-back text must be released at the token limit")
            self.assertEqual(finish, "length")

    def test_completion_prompt_forms(self):
        base = self.complete(STORIES_PROMPT, 16)["choices"][0]["text"]
        arr = self.complete([STORIES_PROMPT], 16)["choices"][0]["text"]
        self.assertEqual(arr, base, "prompt as an array of one string equals the string")
        r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT_IDS, "max_tokens": 16, "temperature": 0})
        if r.status == 200:  # token-id prompts: the issue allows them, the spec says 400 until [ext]
            self.assertIsInstance(r.json()["choices"][0]["text"], str)
        else:
            self.assertOpenAIError(r, 400, field="prompt")
        self.assertOpenAIError(self.server.post("/v1/completions", {"prompt": ["a", {"b": 1}], "max_tokens": 2}), 400, field="prompt")
        self.assertOpenAIError(self.server.post("/v1/completions", {"max_tokens": 2}), 400, field="prompt")
        self.assertOpenAIError(self.server.post("/v1/completions", {"prompt": {"a": 1}, "max_tokens": 2}), 400, field="prompt")

    def test_completion_rejects_options_it_cannot_honour(self):
        for extra, field in (({"n": 0}, "n"), ({"n": 65}, "n"), ({"best_of": 3}, "best_of"), ({"echo": True}, "echo"),
                             ({"suffix": "The end."}, "suffix")):
            body = {"prompt": STORIES_PROMPT, "max_tokens": 2, **extra}
            self.assertOpenAIError(self.server.post("/v1/completions", body), 400, field=field,
                                   type_="invalid_request_error")
        for extra in ({"n": 1}, {"best_of": 1}, {"echo": False}, {"user": "u1", "metadata": {"a": "b"}, "store": False,
                                                                  "service_tier": "auto", "frobnicate": [1, 2]}):
            r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 2, **extra})
            self.assertEqual(r.status, 200, f"{extra} must be accepted: {r}")

    def test_completion_legacy_logprobs(self):
        out = self.complete(STORIES_PROMPT, 12, logprobs=3)
        lp = out["choices"][0]["logprobs"]
        self.assertIsInstance(lp, dict, f"logprobs: 3 gives the legacy object: {out}")
        for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            self.assertIn(k, lp, f"legacy logprobs carry {k}")
            self.assertEqual(len(lp[k]), 12, f"one {k} entry per generated token: {lp}")
        for i, (t, l, top) in enumerate(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])):
            self.assertLessEqual(l, 1e-6, "a log-probability is <= 0")
            self.assertIsInstance(top, dict)
            self.assertTrue(1 <= len(top) <= 3, f"top_logprobs has up to 3 entries: {top}")
            self.assertTrue(all(v <= 1e-6 for v in top.values()))
            self.assertAlmostEqual(l, max(top.values()), places=4, msg="greedy picks the top entry")
        self.assertEqual(lp["text_offset"], sorted(lp["text_offset"]), "text_offset is non-decreasing")
        self.assertOpenAIError(self.server.post("/v1/completions", {"prompt": "x", "max_tokens": 2, "logprobs": 50}),
                               400, field="logprobs")
        self.assertOpenAIError(self.server.post("/v1/completions", {"prompt": "x", "max_tokens": 2, "logprobs": -1}),
                               400, field="logprobs")

    def test_seed_reproducible(self):
        def sample(seed):
            return self.complete(STORIES_PROMPT, 32, temperature=1.0, seed=seed)["choices"][0]["text"]
        a, b = sample(1234), sample(1234)
        self.assertEqual(a, b, "same seed at temperature 1 must give the same text")
        distinct = {sample(s) for s in (1, 2, 3, 4, 5)}
        self.assertGreater(len(distinct), 1, "different seeds should give different samples at temperature 1")

    def test_tokenize_detokenize(self):
        r = self.server.post("/tokenize", {"content": STORIES_PROMPT})
        self.assertEqual(r.status, 200, f"POST /tokenize: {r}")
        toks = r.json().get("tokens")
        self.assertIn(toks, (STORIES_PROMPT_IDS, STORIES_PROMPT_IDS[1:]),
                      f"/tokenize gives the tokenizer's ids (with or without BOS): {r}")
        r = self.server.post("/detokenize", {"tokens": STORIES_PROMPT_IDS[1:]})
        self.assertEqual(r.status, 200, f"POST /detokenize: {r}")
        self.assertIn(r.json().get("content"), (STORIES_PROMPT, " " + STORIES_PROMPT), f"detokenize round trip: {r}")
        self.assertEqual(self.server.post("/tokenize", {"content": 5}).status // 100, 4, "/tokenize with a non-string is a 4xx")
        self.assertEqual(self.server.post("/detokenize", {"tokens": ["a"]}).status // 100, 4, "/detokenize with non-ids is a 4xx")
        self.assertEqual(self.server.post("/detokenize", {"tokens": [10 ** 9]}).status // 100, 4, "out-of-vocab id is a 4xx")

    def test_chat_without_template_is_not_a_server_error(self):
        r = self.server.post("/v1/chat/completions", chat_body("Hello", 4))
        if r.status == 200:
            self.assertEqual(r.json()["object"], "chat.completion")
        else:
            self.assertOpenAIError(r, 400)

    def test_metrics_prometheus(self):
        self.complete(STORIES_PROMPT, 4)
        r = self.server.request("GET", "/metrics")
        self.assertEqual(r.status, 200)
        self.assertTrue(r.headers.get("content-type", "").startswith("text/plain"), f"Prometheus text: {r.headers}")
        m = self.server.metrics()
        for name in ("larder_requests_total", "larder_prompt_tokens_total", "larder_generated_tokens_total",
                     "larder_queue_depth", "larder_active_requests"):
            self.assertIn(name, m, f"/metrics must export {name}")
        self.assertGreaterEqual(metric_sum(m, "larder_requests_total"), 1)
        self.assertGreaterEqual(metric_sum(m, "larder_generated_tokens_total"), 4)
        self.assertTrue(any("route" in lab for lab, _ in m["larder_requests_total"]), "requests_total has a route label")

    def test_stats_json(self):
        r = self.server.request("GET", "/stats")
        if r.status == 404:
            self.skipTest("/stats is [ext] in server-api.md §1")
        self.assertEqual(r.status, 200, r)
        self.assertIsInstance(r.json(), dict, "/stats is a JSON object")

    def test_unknown_route_404(self):
        for method, path in (("GET", "/nope"), ("POST", "/v1/nope"), ("GET", "/v1/chat/completions/x")):
            self.assertOpenAIError(self.server.request(method, path, {} if method == "POST" else None), 404,
                                   type_="not_found_error")

    def test_wrong_method_405(self):
        for method, path in (("GET", "/v1/chat/completions"), ("GET", "/v1/completions"), ("POST", "/v1/models"),
                             ("DELETE", "/v1/chat/completions")):
            r = self.server.request(method, path, {} if method == "POST" else None)
            self.assertEqual(r.status, 405, f"{method} {path}: wrong method is 405; got {r}")
        r = self.server.request("GET", "/v1/messages")
        self.assertEqual(r.status, 405, f"GET /v1/messages is 405: {r}")

    def test_malformed_json_400(self):
        for body in (b"{", b"not json", b'{"prompt": "x",}', b"", b"\xff\xfe", b'["prompt"]', b"null"):
            r = self.server.post("/v1/completions", body, {"Content-Type": "application/json"})
            self.assertOpenAIError(r, 400, type_="invalid_request_error")
        self.assertHealthy()

    def test_body_over_limit_413(self):
        size = 33 * 1024 * 1024
        status, body = send_large_body(self.server.port, "/v1/completions", size)
        self.assertEqual(status, 413, f"a {size}-byte body is over the 32 MiB limit: got {status} {body[:300]!r}")
        status, body = send_large_body(self.server.port, "/v1/messages", size)
        self.assertEqual(status, 413, f"/v1/messages body over the limit: got {status} {body[:300]!r}")
        if body:
            obj = json.loads(body)
            self.assertEqual(obj.get("type"), "error")
            self.assertEqual(obj["error"]["type"], "request_too_large", f"Anthropic 413 type: {obj}")
        # A large body under the limit is parsed (and rejected on content, not size).
        r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 1, "pad": "x" * (4 << 20)})
        self.assertEqual(r.status, 200, f"a 4 MiB body is under the limit (unknown fields ignored): {r}")
        self.assertHealthy()

    def test_generation_headers(self):
        r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 2},
                             {"x-request-id": "req-abc-123"})
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers.get("x-request-id"), "req-abc-123", "x-request-id is echoed")
        self.assertRegex(r.headers.get("x-larder-cache", ""), CACHE_HDR, "x-larder-cache: tier=..; reused=..; reason=..")
        r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 2})
        self.assertTrue(r.headers.get("x-request-id"), "every generation response carries x-request-id")

    def test_cors_off_unless_configured(self):
        r = self.server.request("OPTIONS", "/v1/completions", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
        self.assertNotIn("access-control-allow-origin", r.headers, f"no CORS without --cors: {r.headers}")
        r = self.server.post("/v1/completions", {"prompt": "x", "max_tokens": 1}, {"Origin": "http://evil.example"})
        self.assertNotIn("access-control-allow-origin", r.headers)

    def test_host_check_on_loopback(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        try:
            conn.putrequest("GET", "/v1/models", skip_host=True)
            conn.putheader("Host", "attacker.example:%d" % self.server.port)
            conn.endheaders()
            r = conn.getresponse()
            r.read()
            self.assertEqual(r.status // 100, 4, f"a foreign Host header on a loopback bind is rejected (§12); got {r.status}")
        finally:
            conn.close()
        conn = http.client.HTTPConnection("localhost", self.server.port, timeout=30)
        try:
            conn.request("GET", "/v1/models")
            r = conn.getresponse()
            r.read()
            self.assertEqual(r.status, 200, "Host: localhost:PORT is accepted")
        finally:
            conn.close()

    def test_concurrent_completions_equal_alone(self):
        names = ["Lily", "Tom", "Ben", "Sue", "Max", "Anna", "Sam", "Mia"]
        prompts = [f"{names[i % 8]} had a {w}" for i, w in enumerate(
            ["ball", "cat", "box", "hat", "toy", "cake", "kite", "boat", "dog", "bird", "car", "tree", "book", "cup", "bed", "sun"])]
        results = [None] * 16
        errors = []
        barrier = threading.Barrier(16)

        def run(i):
            try:
                barrier.wait()
                body = {"prompt": prompts[i], "max_tokens": 24, "temperature": 0, "stream": i % 2 == 1}
                if i % 2:
                    r, ev = self.server.stream("/v1/completions", body)
                    results[i] = sse_completion_text(self, openai_chunks(self, ev))[0]
                else:
                    results[i] = self.server.post("/v1/completions", body).json()["choices"][0]["text"]
            except Exception as e:  # noqa: BLE001 - reported below with the request number
                errors.append((i, repr(e)))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [], "all 16 concurrent completions must succeed with valid streams")
        for i, p in enumerate(prompts):
            alone = self.complete(p, 24)["choices"][0]["text"]
            self.assertEqual(results[i], alone, f"request {i} ({p!r}) in a batch of 16 must equal its greedy run alone")


# =============================================================================================
class StreamPacingTest(ServerTestCase):
    """--stream-flush-ms: once tokens flow a stream writes at most once per interval, the tokens
    made meanwhile together; the last event is never held back, and the text is the same."""
    FLUSH_MS = 150
    FLAGS = ("--parallel", "1", "--stream-flush-ms", str(FLUSH_MS))

    def raw_stream(self, body):
        """(seconds from send to the end, number of reads that carried events, bytes)."""
        import socket as so
        payload = json.dumps(body).encode()
        s = so.create_connection(("127.0.0.1", self.server.port), timeout=60)
        t0 = time.monotonic()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
        reads, raw = 0, b""
        while True:
            d = s.recv(1 << 20)
            if not d:
                break
            raw += d
            reads += b"data:" in d
        s.close()
        return time.monotonic() - t0, reads, raw

    def test_tokens_go_out_together_and_the_end_is_not_held(self):
        n = 300
        body = {"prompt": STORIES_PROMPT, "max_tokens": n, "temperature": 0, "stream": True}
        want = self.server.post("/v1/completions", dict(body, stream=False)).json()
        self.assertEqual(want["usage"]["completion_tokens"], n, f"the test needs a long answer: {want}")
        seconds, reads, raw = self.raw_stream(body)
        # Every event is its own SSE frame, one per token at least, though several share a write.
        self.assertIn(b"data: [DONE]", raw)
        frames = raw.count(b"data: {")
        self.assertGreaterEqual(frames, n // 2, f"{frames} frames for {n} tokens")
        # At most one write per interval after the first token, a few more for the first and the last
        # (a large write may also arrive in two reads). Unpaced, this stream took 50-80 reads.
        most = 6 + int(seconds * 1000 / self.FLUSH_MS)
        self.assertLessEqual(reads, most, f"{reads} reads carried events in {seconds:.3f} s at one write per "
                                          f"{self.FLUSH_MS} ms; the stream is not paced")
        # The same text as the answer that was not streamed.
        r, events = self.server.stream("/v1/completions", body)
        text = "".join(json.loads(e.data)["choices"][0]["text"] for e in events if e.data and e.data != "[DONE]")
        self.assertEqual(text, want["choices"][0]["text"])
        # The last event is not held for the interval: a whole answer that takes less than the
        # interval ends about when it is generated (its first token goes out at once; the rest
        # wait for the last event, which wakes the writer).
        short = {"prompt": STORIES_PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
        best = min(self.raw_stream(short)[0] for _ in range(3))
        self.assertLess(best, self.FLUSH_MS / 1000 * 0.8, f"an 8-token stream took {best:.3f} s: the end was held")


class ChatModelTest(ServerTestCase):
    """The random-weight Llama with the Llama 3 chat template: chat completions and messages."""
    FLAGS = ("--parallel", "16")

    @classmethod
    def server_model(cls):
        return chat_model()["dir"]

    def chat(self, messages, n=16, **kw):
        body = {"messages": messages, "max_tokens": n, "temperature": 0}
        body.update(kw)
        r = self.server.post("/v1/chat/completions", body)
        self.assertEqual(r.status, 200, f"/v1/chat/completions should answer 200: {r}")
        return r.json()

    def text(self, messages, n=16, **kw):
        return self.chat(messages, n, **kw)["choices"][0]["message"]["content"]

    def test_models_list_served_id(self):
        self.assertEqual(self.server.model_id(), CHAT_MODEL_NAME, "a model directory is served under its name")

    def test_chat_equals_larder_generate(self):
        for prompt in ("Tell me a story about a lighthouse.", "hi"):
            expected = generate(chat_model()["dir"], prompt, 20, chat=True)
            self.assertEqual(self.text(user(prompt), 20), expected, f"greedy chat for {prompt!r} must equal `larder generate --chat`")
        expected = generate(chat_model()["dir"], "What is salt?", 20, chat=True, system="You are terse.")
        got = self.text([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is salt?"}], 20)
        self.assertEqual(got, expected, "system + user must equal `larder generate --chat --system`")
        dev = self.text([{"role": "developer", "content": "You are terse."}, {"role": "user", "content": "What is salt?"}], 20)
        self.assertEqual(dev, expected, "role developer maps to system")
        parts = self.text([{"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
                           {"role": "user", "content": [{"type": "text", "text": "What is salt?"}]}], 20)
        self.assertEqual(parts, expected, "text content parts equal the plain string content")
        c = self.server.openai().chat.completions.create(model=CHAT_MODEL_NAME, messages=user("hi"), max_tokens=20, temperature=0)
        self.assertEqual(c.choices[0].message.content, generate(chat_model()["dir"], "hi", 20, chat=True))

    def test_chat_response_shape(self):
        r = self.server.post("/v1/chat/completions", chat_body("Describe the sea.", 8), {"x-request-id": "abc-1"})
        self.assertEqual(r.status, 200, r)
        out = r.json()
        for k in ("id", "object", "created", "model", "choices", "usage"):
            self.assertIn(k, out, f"chat.completion carries {k}")
        self.assertTrue(ID_RE["chat"].match(out["id"]), f"id is chatcmpl- + 24 base62: {out['id']}")
        self.assertEqual(out["object"], "chat.completion")
        self.assertEqual(out["model"], CHAT_MODEL_NAME)
        self.assertTrue(str(out.get("system_fingerprint", "")).startswith("larder-"), f"system_fingerprint larder-<v>-<isa>: {out}")
        ch = out["choices"][0]
        self.assertEqual(ch["index"], 0)
        self.assertIn("logprobs", ch)
        self.assertIsNone(ch["logprobs"], "logprobs is null when not requested")
        self.assertEqual(ch["finish_reason"], "length")
        msg = ch["message"]
        self.assertEqual(msg["role"], "assistant")
        self.assertIsInstance(msg["content"], str)
        self.assertIn("refusal", msg, "message.refusal is OpenAPI-required (null)")
        self.assertIsNone(msg["refusal"])
        u = out["usage"]
        self.assertEqual(u["completion_tokens"], 8)
        self.assertEqual(u["total_tokens"], u["prompt_tokens"] + u["completion_tokens"])
        self.assertIsInstance(u["prompt_tokens_details"]["cached_tokens"], int)
        self.assertEqual(r.headers.get("x-request-id"), "abc-1")
        self.assertRegex(r.headers.get("x-larder-cache", ""), CACHE_HDR)

    def test_chat_stream_framing_and_equality(self):
        msgs = user("Write two lines about rain.")
        full = self.chat(msgs, 24)
        r, events = self.server.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 24,
                                                                "temperature": 0, "stream": True})
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.headers.get("content-type", "").startswith("text/event-stream"), f"SSE content type: {r.headers}")
        self.assertIn("no-cache", r.headers.get("cache-control", ""), "Cache-Control: no-cache on streams")
        chunks = openai_chunks(self, events)
        text, finish, fi = sse_chat_text(self, chunks)
        self.assertEqual(text, full["choices"][0]["message"]["content"], "joined deltas must equal the non-stream content")
        self.assertEqual(finish, "length")
        self.assertTrue(all(c["choices"] for c in chunks), "no choices: [] chunk without include_usage")
        self.assertEqual((chunks[fi].get("usage") or {}).get("completion_tokens"), 24, "usage rides on the final chunk")
        self.assertRegex(r.headers.get("x-larder-cache", ""), CACHE_HDR, "streams carry x-larder-cache too")
        # The official client.
        s = self.server.openai().chat.completions.create(model=CHAT_MODEL_NAME, messages=msgs, max_tokens=24,
                                                         temperature=0, stream=True)
        parts, finishes = [], []
        for c in s:
            if c.choices:
                parts.append(c.choices[0].delta.content or "")
                if c.choices[0].finish_reason:
                    finishes.append(c.choices[0].finish_reason)
        self.assertEqual("".join(parts), text)
        self.assertEqual(finishes, ["length"])

    def test_chat_include_usage(self):
        msgs = user("Count the stars.")
        full = self.chat(msgs, 10)
        r, events = self.server.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 10, "temperature": 0,
                                                                "stream": True, "stream_options": {"include_usage": True}})
        chunks = openai_chunks(self, events)
        text, _, fi = sse_chat_text(self, chunks)
        u = check_include_usage(self, chunks, fi)
        self.assertEqual(text, full["choices"][0]["message"]["content"])
        self.assertEqual(u["prompt_tokens"], full["usage"]["prompt_tokens"])
        self.assertEqual(u["completion_tokens"], 10)
        s = self.server.openai().chat.completions.create(model="m", messages=msgs, max_tokens=10, temperature=0,
                                                         stream=True, stream_options={"include_usage": True})
        got = list(s)
        self.assertEqual(got[-1].choices, [])
        self.assertEqual(got[-1].usage.completion_tokens, 10)

    def test_max_completion_tokens_wins(self):
        out = self.chat(user("Name a river."), 20, max_completion_tokens=5)
        self.assertEqual(out["usage"]["completion_tokens"], 5, "max_completion_tokens wins over max_tokens")
        self.assertEqual(out["choices"][0]["finish_reason"], "length")

    def test_chat_stop_strings(self):
        msgs = user("List some words.")
        full = self.text(msgs, 40)
        stop = boundary_stop(full, 4)
        later = boundary_stop(full, 8)
        expected = full[:full.index(stop)]
        for stops in (stop, [stop], [later, stop], ["", stop]):
            out = self.chat(msgs, 40, stop=stops)
            self.assertEqual(out["choices"][0]["message"]["content"], expected, f"stop={stops!r}: text before the earliest match")
            self.assertEqual(out["choices"][0]["finish_reason"], "stop")
            r, events = self.server.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 40, "temperature": 0,
                                                                    "stream": True, "stop": stops})
            chunks = openai_chunks(self, events)
            text, finish, _ = sse_chat_text(self, chunks)
            self.assertEqual(text, expected, f"stream, stop={stops!r}: no part of the stop string is ever sent")
            self.assertEqual(finish, "stop")
            for c in chunks:
                for ch in c["choices"]:
                    self.assertNotIn(stop, ch["delta"].get("content") or "")
        # A stop at the very start leaves an empty (not null) content.
        out = self.chat(msgs, 40, stop=full[:4])
        self.assertEqual(out["choices"][0]["message"]["content"], "", "content is '' when a stop matches at once")
        self.assertEqual(out["choices"][0]["finish_reason"], "stop")
        self.assertOpenAIError(self.server.post("/v1/chat/completions", chat_body("x", 2, stop=123)), 400, field="stop")
        self.assertOpenAIError(self.server.post("/v1/chat/completions", chat_body("x", 2, stop=[str(i) for i in range(17)])),
                               400, field="stop")

    def test_cached_tokens_on_repeated_prefix(self):
        msgs = [{"role": "system", "content": LONG_TEXT * 3}, {"role": "user", "content": "Summarise the ledger (cache test)."}]
        first = self.chat(msgs, 12)
        r2 = self.server.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0})
        second = r2.json()
        p = first["usage"]["prompt_tokens"]
        m = re.search(r"reused=(\d+)", r2.headers.get("x-larder-cache", ""))
        self.assertIsNotNone(m, f"x-larder-cache header with reused=<n>: {r2.headers}")
        self.assertEqual(int(m.group(1)), second["usage"]["prompt_tokens_details"]["cached_tokens"],
                         "x-larder-cache reused= matches usage.cached_tokens")
        self.assertEqual(second["usage"]["prompt_tokens"], p)
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        self.assertGreater(cached, 0, f"a repeated prompt must report cached_tokens > 0: {second['usage']}")
        self.assertEqual(cached, p - 1, f"an exact repeat reuses len - 1 tokens (server-api.md §9): {second['usage']}")
        self.assertEqual(second["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"],
                         "a cache hit must not change greedy output")
        self.assertEqual(first["choices"][0]["message"]["content"],
                         generate(chat_model()["dir"], msgs[1]["content"], 12, chat=True, system=msgs[0]["content"]),
                         "and equals the cold `larder generate` run")
        # Anthropic surface: input_tokens + cache_read_input_tokens == OpenAI prompt_tokens.
        m = a_create(self.server, model="m", max_tokens=12, temperature=0, system=msgs[0]["content"],
                                                    messages=[msgs[1]])
        self.assertEqual(m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), p,
                         f"Anthropic input + cache_read must equal OpenAI prompt_tokens {p}: {m.usage}")
        self.assertGreater(m.usage.cache_read_input_tokens or 0, 0, "the third identical prompt reads the cache")
        self.assertEqual(m.usage.cache_creation_input_tokens or 0, 0)
        self.assertEqual(m.content[0].text, first["choices"][0]["message"]["content"], "same prompt, same greedy text on /v1/messages")
        # Completions surface: the rendered prompt is a different token sequence, but a repeat still hits.
        body = {"prompt": LONG_TEXT * 2, "max_tokens": 4, "temperature": 0}
        a = self.server.post("/v1/completions", body).json()
        b = self.server.post("/v1/completions", body).json()
        self.assertEqual(b["usage"]["prompt_tokens_details"]["cached_tokens"], b["usage"]["prompt_tokens"] - 1,
                         f"completions: exact repeat reuses len - 1: {b['usage']}")
        self.assertEqual(a["choices"][0]["text"], b["choices"][0]["text"])

    def test_anthropic_message(self):
        prompt = "Tell me about the northern road."
        oa = self.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}], 12)
        r = self.server.post("/v1/messages", {"model": "claude-x", "max_tokens": 12, "temperature": 0, "system": "Be brief.",
                                              "messages": [{"role": "user", "content": prompt}]},
                             {"anthropic-version": "2023-06-01"})
        self.assertEqual(r.status, 200, r)
        m = r.json()
        self.assertTrue(ID_RE["msg"].match(m["id"]), f"id is msg_ + 24 base62: {m['id']}")
        self.assertEqual(m["type"], "message")
        self.assertEqual(m["role"], "assistant")
        self.assertEqual(m["model"], CHAT_MODEL_NAME)
        self.assertEqual(m["stop_reason"], "max_tokens", "token limit -> stop_reason max_tokens")
        self.assertIn("stop_sequence", m)
        self.assertIsNone(m["stop_sequence"])
        self.assertEqual([b["type"] for b in m["content"]], ["text"])
        self.assertEqual(m["content"][0]["text"], oa["choices"][0]["message"]["content"], "same prompt, same greedy text")
        u = m["usage"]
        self.assertEqual(u["output_tokens"], 12)
        self.assertEqual(u["input_tokens"] + u.get("cache_read_input_tokens", 0), oa["usage"]["prompt_tokens"],
                         f"Anthropic input + cache_read == OpenAI prompt_tokens: {u} vs {oa['usage']}")
        self.assertEqual(u.get("cache_creation_input_tokens", 0), 0)
        # System as blocks and content as blocks give the same prompt.
        m2 = a_create(self.server, 
            model="m", max_tokens=12, temperature=0, system=[{"type": "text", "text": "Be brief."}],
            messages=[{"role": "user", "content": [{"type": "text", "text": prompt}]}])
        self.assertEqual(m2.content[0].text, m["content"][0]["text"])
        # max_tokens is optional here (documented leniency); the stop sequence " " (every token of this
        # model starts with a space) keeps it from running to the context limit.
        r = self.server.post("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "temperature": 0,
                                              "stop_sequences": [" "]})
        self.assertEqual(r.status, 200, f"/v1/messages without max_tokens is accepted: {r}")

    def test_anthropic_stream_events(self):
        prompt = "Describe the lower market."
        full = a_create(self.server, model="m", max_tokens=14, temperature=0,
                                                       messages=user(prompt))
        r, events = self.server.stream("/v1/messages", {"max_tokens": 14, "temperature": 0, "stream": True,
                                                        "messages": user(prompt)})
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.headers.get("content-type", "").startswith("text/event-stream"))
        evs = anthropic_events(self, events)
        names = [n for n, _ in evs]
        self.assertEqual(names[0], "message_start", f"order: {names}")
        self.assertEqual(names[1], "content_block_start", f"order: {names}")
        self.assertEqual(names[-3:], ["content_block_stop", "message_delta", "message_stop"], f"order: {names}")
        self.assertTrue(all(n == "content_block_delta" for n in names[2:-3]), f"only deltas between start and stop: {names}")
        start = evs[0][1]["message"]
        self.assertEqual(start["content"], [], "message_start carries an empty content")
        self.assertIsNone(start["stop_reason"])
        self.assertIn("input_tokens", start["usage"])
        self.assertEqual(evs[1][1]["index"], 0)
        self.assertEqual(evs[1][1]["content_block"]["type"], "text")
        text = ""
        for n, o in evs[2:-3]:
            self.assertEqual(o["delta"]["type"], "text_delta")
            text += o["delta"]["text"]
        self.assertEqual(text, full.content[0].text, "joined text_delta equals the non-stream text")
        md = evs[-2][1]
        self.assertEqual(md["delta"]["stop_reason"], "max_tokens")
        self.assertEqual(md["usage"]["output_tokens"], 14)
        # The official client's stream helper.
        with self.server.anthropic().messages.stream(**sampling_to_extra_body(dict(model="m", max_tokens=14, temperature=0,
                                                                                   messages=user(prompt)))) as s:
            joined = "".join(s.text_stream)
            final = s.get_final_message()
        self.assertEqual(joined, full.content[0].text)
        self.assertEqual(final.stop_reason, "max_tokens")

    def test_anthropic_stop_sequence(self):
        msgs = user("Give me a list.")
        full = a_create(self.server, model="m", max_tokens=40, temperature=0, messages=msgs).content[0].text
        stop = boundary_stop(full, 3)
        m = a_create(self.server, model="m", max_tokens=40, temperature=0, messages=msgs,
                                                    stop_sequences=["\u00a7nope", stop])
        self.assertEqual(m.content[0].text if m.content else "", full[:full.index(stop)])
        self.assertEqual(m.stop_reason, "stop_sequence")
        self.assertEqual(m.stop_sequence, stop, "stop_sequence names the matched string")
        r, events = self.server.stream("/v1/messages", {"max_tokens": 40, "temperature": 0, "stream": True,
                                                        "messages": msgs, "stop_sequences": [stop]})
        evs = anthropic_events(self, events)
        text = "".join(o["delta"].get("text", "") for n, o in evs if n == "content_block_delta")
        self.assertEqual(text, full[:full.index(stop)], "no part of the stop sequence is streamed")
        md = [o for n, o in evs if n == "message_delta"][0]
        self.assertEqual(md["delta"]["stop_reason"], "stop_sequence")
        self.assertEqual(md["delta"]["stop_sequence"], stop)

    def test_chat_logprobs(self):
        msgs = user("Pick a word.")
        out = self.chat(msgs, 10, logprobs=True, top_logprobs=3)
        content = out["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(content), 10, "one logprobs entry per generated token")
        self.assertEqual("".join(e["token"] for e in content), out["choices"][0]["message"]["content"],
                         "logprob tokens join to the content")
        for e in content:
            self.assertLessEqual(e["logprob"], 1e-6, f"logprob <= 0: {e}")
            self.assertEqual(e["bytes"], list(e["token"].encode("utf-8")), f"bytes are the token's UTF-8: {e}")
            top = e["top_logprobs"]
            self.assertEqual(len(top), 3, f"top_logprobs: 3 entries: {e}")
            lps = [t["logprob"] for t in top]
            self.assertEqual(lps, sorted(lps, reverse=True), f"top_logprobs sorted descending: {top}")
            self.assertTrue(all(lp <= 1e-6 for lp in lps))
            for t in top:
                self.assertEqual(t["bytes"], list(t["token"].encode("utf-8")))
            self.assertEqual(top[0]["token"], e["token"], "greedy picks the most likely token")
            self.assertAlmostEqual(top[0]["logprob"], e["logprob"], places=4)
        plain = self.chat(msgs, 10, logprobs=True)
        self.assertEqual(len(plain["choices"][0]["logprobs"]["content"]), 10)
        # Streamed: each chunk carries the logprobs of the text it releases.
        r, events = self.server.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 10, "temperature": 0,
                                                                "stream": True, "logprobs": True, "top_logprobs": 3})
        streamed = []
        for c in openai_chunks(self, events):
            for ch in c["choices"]:
                if ch.get("logprobs") and ch["logprobs"].get("content"):
                    streamed += ch["logprobs"]["content"]
        self.assertEqual([e["token"] for e in streamed], [e["token"] for e in content], "streamed logprob tokens equal non-stream")
        for e, f in zip(streamed, content):
            self.assertAlmostEqual(e["logprob"], f["logprob"], places=4)

    def test_chat_logprob_validation(self):
        for extra, field in (({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
                             ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                             ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
                             ({"logprobs": True, "top_logprobs": "3"}, "top_logprobs"),
                             ({"logprobs": "yes"}, "logprobs"), ({"logprobs": 1.5}, "logprobs")):
            r = self.server.post("/v1/chat/completions", chat_body("hi", 2, **extra))
            self.assertOpenAIError(r, 400, field=field, type_="invalid_request_error")
        r = self.server.post("/v1/chat/completions", chat_body("hi", 2, logprobs=True, top_logprobs=20))
        self.assertEqual(r.status, 200, f"top_logprobs 20 is the maximum and allowed: {r}")
        self.assertHealthy()

    def test_chat_seed_reproducible(self):
        def sample(seed):
            return self.text(user("Tell me anything."), 16, temperature=2.0, seed=seed)
        a, b = sample(77), sample(77)
        self.assertEqual(a, b, "same seed at temperature 2 gives the same text")
        self.assertGreater(len({sample(s) for s in (1, 2, 3, 4)}), 1, "different seeds should differ at temperature 2")

    def test_sampler_filters_that_leave_one_token_are_greedy(self):
        msgs = user("Filters.")
        greedy = self.text(msgs, 12)
        for extra in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
            got = self.text(msgs, 12, temperature=2.0, seed=11, **extra)
            self.assertEqual(got, greedy, f"{extra} keeps only the most likely token, so sampling at temperature 2 is greedy")
        a = self.server.post("/v1/messages", {"messages": msgs, "max_tokens": 12, "temperature": 2.0, "top_k": 1})
        self.assertEqual(a.json()["content"][0]["text"], greedy, "top_k 1 on /v1/messages is greedy too")

    def test_logit_bias(self):
        with open(os.path.join(chat_model()["dir"], "tokenizer.json"), encoding="utf-8") as f:
            vocab = json.load(f)["model"]["vocab"]
        by_id = {i: p for p, i in vocab.items()}
        tok = chat_model()["allowed"][7]
        word = by_id[tok].replace("\u0120", " ")
        out = self.chat(user("Bias."), 5, logit_bias={str(tok): 100})
        self.assertEqual(out["choices"][0]["message"]["content"], word * 5, f"logit_bias +100 on {tok} ({word!r}) forces it")
        greedy = self.chat(user("Bias."), 3, logprobs=True)
        first = greedy["choices"][0]["logprobs"]["content"][0]["token"]
        first_id = vocab[first.replace(" ", "\u0120")]
        banned = self.chat(user("Bias."), 3, logit_bias={str(first_id): -100}, logprobs=True)
        self.assertNotEqual(banned["choices"][0]["logprobs"]["content"][0]["token"], first,
                            f"logit_bias -100 on the greedy first token {first!r} must change it")

    def test_count_tokens_ext(self):
        body = {"model": "m", "system": "Count me.", "messages": user("How many tokens is this?")}
        r = self.server.post("/v1/messages/count_tokens", body)
        if r.status == 404:
            self.skipTest("/v1/messages/count_tokens is [ext] in server-api.md §1")
        self.assertEqual(r.status, 200, r)
        m = self.server.post("/v1/messages", {**body, "max_tokens": 1, "temperature": 0}).json()["usage"]
        self.assertEqual(r.json()["input_tokens"], m["input_tokens"] + m.get("cache_read_input_tokens", 0))

    def test_max_tokens_one(self):
        out = self.chat(user("One."), 1)
        self.assertEqual(out["usage"]["completion_tokens"], 1)
        self.assertEqual(out["choices"][0]["finish_reason"], "length")
        self.assertEqual(out["choices"][0]["message"]["content"], self.text(user("One."), 4)[:len(out["choices"][0]["message"]["content"])])

    def test_tokenize_detokenize_roundtrip(self):
        text = "Hello world, this is a test of the tokenizer."
        code, out, err = run_cli("tokenize", chat_model()["dir"], "--text", text)
        self.assertEqual(code, 0, err)
        plain = json.loads(out)
        code, out, err = run_cli("tokenize", chat_model()["dir"], "--text", text, "--add-special")
        special = json.loads(out)
        r = self.server.post("/tokenize", {"content": text})
        self.assertEqual(r.status, 200, r)
        self.assertIn(r.json()["tokens"], (plain, special), "/tokenize equals `larder tokenize` (with or without specials)")
        r = self.server.post("/detokenize", {"tokens": plain})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["content"], text, "detokenize(tokenize(text)) == text")

    def test_messages_validation(self):
        bad = {"null": None, "string": "hello", "[123]": [123], "[{}]": [{}],
               "bad role": [{"role": "wizard", "content": "hi"}], "empty": [],
               "content int": [{"role": "user", "content": 123}],
               "content bad part": [{"role": "user", "content": [{"type": "input_audio",
                                                                   "input_audio": {"data": "AAAA", "format": "wav"}}]}],
               "image on text model": [{"role": "user", "content": [{"type": "image_url",
                                                                     "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}],
               "role int": [{"role": 5, "content": "hi"}]}
        for name, messages in bad.items():
          with self.subTest(messages=name):
            r = self.server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 2})
            self.assertOpenAIError(r, 400, field="messages" if name in ("null", "string", "[123]", "[{}]", "bad role", "empty", "role int") else None,
                                   type_="invalid_request_error")
        r = self.server.post("/v1/chat/completions", {"max_tokens": 2})
        self.assertOpenAIError(r, 400, field="messages")
        self.assertHealthy()
        self.assertEqual(len(self.text(user("still there?"), 3)) > 0, True, "the server keeps serving after bad input")

    def test_field_type_validation(self):
        cases = [({"temperature": "hot"}, "temperature"), ({"temperature": -1}, "temperature"), ({"temperature": 6}, "temperature"),
                 ({"max_tokens": -1}, "max_tokens"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": "ten"}, "max_tokens"),
                 ({"max_tokens": 2.5}, "max_tokens"), ({"max_completion_tokens": -5}, "max_completion_tokens"),
                 ({"top_p": 1.5}, "top_p"), ({"top_p": "x"}, "top_p"), ({"top_k": -1}, "top_k"), ({"min_p": 2}, "min_p"),
                 ({"presence_penalty": 3}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
                 ({"repetition_penalty": 0}, "repetition_penalty"), ({"repetition_penalty": -1}, "repetition_penalty"),
                 ({"logit_bias": "x"}, "logit_bias"), ({"logit_bias": {"abc": 1}}, "logit_bias"),
                 ({"logit_bias": {"5": "big"}}, "logit_bias"), ({"seed": "abc"}, "seed"),
                 ({"n": 0}, "n"), ({"stream": "yes"}, "stream")]
        for extra, field in cases:
            with self.subTest(body_fields=extra):
                body = {"messages": user("hi"), "max_tokens": 2, "temperature": 0}
                body.update(extra)
                r = self.server.post("/v1/chat/completions", body)
                self.assertOpenAIError(r, 400, field=field, type_="invalid_request_error")
        # seed -1: u64 in the spec, "random" in llama-server; either answer is fine, never a 5xx.
        self.assertIn(self.server.post("/v1/chat/completions", chat_body("hi", 2, seed=-1)).status, (200, 400))
        r = self.server.post("/v1/chat/completions", chat_body("hi", 2, logit_bias={"abc": 1}))
        self.assertIn("logit_bias must be a dict of int to float", r.json()["error"]["message"])
        r = self.server.post("/v1/chat/completions", chat_body("hi", 2, logprobs="yes"))
        self.assertIn("logprobs must be of type bool", r.json()["error"]["message"], "mlx_lm.server's wording (§10)")
        for extra in ({"n": 1}, {"user": "u", "metadata": {"k": "v"}, "store": True, "service_tier": "default",
                                 "parallel_tool_calls": False, "unknown_thing": {"deep": [1]}}, {"model": "not-this-one"},
                      {"logit_bias": {"5": -100}}, {"seed": 2 ** 64 - 1}):
            r = self.server.post("/v1/chat/completions", chat_body("hi", 2, **extra))
            self.assertEqual(r.status, 200, f"{extra} is valid and must be accepted: {r}")
        body = chat_body("hi", 2)
        del body["temperature"]
        self.assertEqual(self.server.post("/v1/chat/completions", body).status, 200, "model field may be omitted")
        self.assertHealthy()

    def test_malformed_json(self):
        for path in ("/v1/chat/completions", "/chat/completions", "/completions"):
            for body in (b"{", b'{"messages": [}', b"\x00\x01garbage", b'{"messages": [{"role": "user", "content": "hi"}]'):
                self.assertOpenAIError(self.server.post(path, body, {"Content-Type": "application/json"}), 400)
        self.assertAnthropicError(self.server.post("/v1/messages", b"{nope", {"Content-Type": "application/json"}),
                                  400, "invalid_request_error")
        self.assertHealthy()

    def test_anthropic_errors(self):
        for body, field in (({"max_tokens": 4}, "messages"), ({"messages": "hi", "max_tokens": 4}, "messages"),
                            ({"messages": [{"role": "system", "content": "x"}], "max_tokens": 4}, None),
                            ({"messages": [], "max_tokens": 4}, "messages"),
                            ({"messages": user("hi"), "max_tokens": "x"}, "max_tokens"),
                            ({"messages": user("hi"), "max_tokens": 4, "temperature": "hot"}, "temperature"),
                            ({"messages": [{"role": "user", "content": [{"type": "audio"}]}], "max_tokens": 4}, None)):
            self.assertAnthropicError(self.server.post("/v1/messages", body), 400, "invalid_request_error", field=field)
        import anthropic
        with self.assertRaises(anthropic.BadRequestError):
            a_create(self.server, model="m", max_tokens=4, messages=[])
        self.assertHealthy()

    def test_concurrent_16_unique_markers(self):
        rng = random.Random(5)
        markers = [f"MK{i:02d}{''.join(rng.choice('QXZJVW') for _ in range(4))}" for i in range(16)]
        prompts = []
        for i, mk in enumerate(markers):
            body = LONG_TEXT * (1 + 3 * (i % 4)) if i % 3 == 0 else ""  # mixed lengths: chunked prefill next to decode
            prompts.append(f"Request {mk}. {body}Repeat the code {mk} and continue.")
        results = [None] * 16
        errors = []
        barrier = threading.Barrier(16)

        def run(i):
            try:
                client = self.server.openai()
                barrier.wait()
                if i % 2:
                    s = client.chat.completions.create(model="m", messages=user(prompts[i]), max_tokens=16,
                                                       temperature=0, stream=True)
                    results[i] = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
                else:
                    c = client.chat.completions.create(model="m", messages=user(prompts[i]), max_tokens=16, temperature=0)
                    results[i] = c.choices[0].message.content
            except Exception as e:  # noqa: BLE001
                errors.append((i, repr(e)))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        self.assertEqual(errors, [], "all 16 concurrent requests must succeed")
        alone = [self.text(user(p), 16) for p in prompts]
        self.assertGreater(len(set(alone)), 8, "sanity: the prompts should lead to different outputs")
        for i in range(16):
            self.assertEqual(results[i], alone[i], f"request {i} in a batch of 16 must equal its greedy run alone")
            for j, mk in enumerate(markers):
                if j != i:
                    self.assertNotIn(mk, results[i], f"marker of request {j} leaked into request {i}")
        # The alone runs above were cache hits; spot-check the batch against cold CLI runs as well.
        for i in (0, 1, 6):
            self.assertEqual(results[i], generate(chat_model()["dir"], prompts[i], 16, chat=True),
                             f"request {i} in the batch must equal `larder generate --chat`")

    def test_route_aliases(self):
        body = chat_body("Alias check.", 6)
        a = self.server.post("/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
        r = self.server.post("/chat/completions", body)
        self.assertEqual(r.status, 200, f"/chat/completions is an alias: {r}")
        self.assertEqual(r.json()["choices"][0]["message"]["content"], a)
        r = self.server.post("/completions", {"prompt": "Alias check.", "max_tokens": 3, "temperature": 0})
        self.assertEqual(r.status, 200, f"/completions is an alias: {r}")


# =============================================================================================
class SmallContextTest(ServerTestCase):
    """--ctx 96: context overflow and max_tokens clamping."""
    CTX = 96
    FLAGS = ("--ctx", "96")

    @classmethod
    def server_model(cls):
        return chat_model()["dir"]

    def test_prompt_longer_than_context(self):
        long = "word " * 300
        r = self.server.post("/v1/chat/completions", chat_body(long, 4))
        err = self.assertOpenAIError(r, 400, code="context_length_exceeded", type_="invalid_request_error")
        self.assertRegex(err["message"], r"maximum context length is 96 tokens\. However, your request has \d+ prompt tokens",
                         "OpenAI wording clients pattern-match (§10)")
        self.assertEqual(err.get("param"), "messages")
        r = self.server.post("/v1/completions", {"prompt": long, "max_tokens": 4})
        err = self.assertOpenAIError(r, 400, code="context_length_exceeded")
        self.assertEqual(err.get("param"), "prompt")
        r = self.server.post("/v1/messages", {"messages": user(long), "max_tokens": 4})
        e = self.assertAnthropicError(r, 400, "invalid_request_error")
        self.assertRegex(e["message"], r"prompt is too long: \d+ tokens > \d+ maximum")
        r, _ = self.server.stream("/v1/chat/completions", chat_body(long, 4, stream=True))
        self.assertEqual(r.status, 400, "a streaming request that cannot fit is refused before the stream opens")
        import openai
        with self.assertRaises(openai.BadRequestError):
            self.server.openai().chat.completions.create(model="m", messages=user(long), max_tokens=4)
        self.assertHealthy()

    def test_huge_max_tokens_is_clamped(self):
        for mt in (10 ** 6, 2 ** 31 - 1):
            r = self.server.post("/v1/chat/completions", chat_body("Hi", mt))
            self.assertEqual(r.status, 200, f"max_tokens {mt} with a short prompt is clamped, never refused: {r}")
            out = r.json()
            u = out["usage"]
            self.assertEqual(out["choices"][0]["finish_reason"], "length")
            self.assertEqual(u["prompt_tokens"] + u["completion_tokens"], self.CTX,
                             f"generation is clamped to context_limit - prompt_tokens (§3): {u}")
        r = self.server.post("/v1/completions", {"prompt": "Hi there", "max_tokens": 10 ** 6, "temperature": 0})
        self.assertEqual(r.status, 200, r)
        u = r.json()["usage"]
        self.assertEqual(u["prompt_tokens"] + u["completion_tokens"], self.CTX, f"completions clamp too: {u}")
        m = a_create(self.server, model="m", max_tokens=10 ** 6, temperature=0, messages=user("Hi"))
        self.assertEqual(m.stop_reason, "max_tokens")
        # Default max_tokens (none for chat) runs to the context limit on a model that never emits EOS.
        r = self.server.post("/v1/chat/completions", {"messages": user("Hi"), "temperature": 0})
        u = r.json()["usage"]
        self.assertEqual(u["prompt_tokens"] + u["completion_tokens"], self.CTX, f"no max_tokens: run to the limit: {u}")


# =============================================================================================
class PromptCacheOffTest(unittest.TestCase):
    """--prompt-cache 0 (cache off) vs the default: same greedy output, cached_tokens 0 vs > 0,
    including a multi-turn conversation whose second turn extends the first."""

    def conversation(self, server):
        def chat(msgs):
            r = server.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "temperature": 0})
            self.assertEqual(r.status, 200, r)
            return r.json()
        sys_msg = {"role": "system", "content": LONG_TEXT * 2}
        a = chat([sys_msg, {"role": "user", "content": "First question?"}])
        a2 = chat([sys_msg, {"role": "user", "content": "First question?"}])
        turn2 = [sys_msg, {"role": "user", "content": "First question?"},
                 {"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "And the second one?"}]
        b = chat(turn2)
        return a, a2, b

    def test_cache_off_equals_cache_on(self):
        off = Server(chat_model()["dir"], "--prompt-cache", "0").start()
        try:
            a_off, a2_off, b_off = self.conversation(off)
        finally:
            self.assertEqual(off.stop(), 0, "SIGTERM exits 0")
        on = Server(chat_model()["dir"]).start()
        try:
            a_on, a2_on, b_on = self.conversation(on)
        finally:
            on.stop()
        for x in (a_off, a2_off, b_off):
            self.assertEqual(x["usage"]["prompt_tokens_details"]["cached_tokens"], 0, f"cache off reports 0 cached: {x['usage']}")
        self.assertGreater(a2_on["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "a repeat hits with the cache on")
        self.assertGreater(b_on["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "turn 2 reuses turn 1's prefix")
        for off_r, on_r, what in ((a_off, a_on, "turn 1"), (a2_off, a2_on, "repeat"), (b_off, b_on, "turn 2")):
            self.assertEqual(on_r["choices"][0]["message"]["content"], off_r["choices"][0]["message"]["content"],
                             f"{what}: output with the cache equals output without it")
            self.assertEqual(on_r["usage"]["prompt_tokens"], off_r["usage"]["prompt_tokens"])


# =============================================================================================
class GenerationConfigTest(ServerTestCase):
    """Defaults come from generation_config.json (here temperature 1.5 with top_k 1, i.e. greedy);
    request fields win, field by field."""

    @classmethod
    def server_model(cls):
        src = chat_model()["dir"]
        d = os.path.join(tmp_root(), "tiny-chat-greedy-default")
        if not os.path.exists(d):
            os.makedirs(d)
            for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
                os.symlink(os.path.join(src, f), os.path.join(d, f))
            with open(os.path.join(d, "generation_config.json"), "w") as f:
                json.dump({"temperature": 1.5, "top_k": 1, "eos_token_id": chat_model()["eos_id"]}, f)
        return d

    def test_defaults_from_generation_config(self):
        prompt = "Defaults please."
        expected = generate(chat_model()["dir"], prompt, 12, chat=True)
        for extra in ({}, {"seed": 4}, {"temperature": 2.0, "seed": 5}):
            r = self.server.post("/v1/chat/completions", {"messages": user(prompt), "max_tokens": 12, **extra})
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json()["choices"][0]["message"]["content"], expected,
                             f"{extra}: generation_config top_k 1 still applies, so the output is greedy")
        hot = {self.server.post("/v1/chat/completions", {"messages": user(prompt), "max_tokens": 12, "temperature": 2.0,
                                                         "top_k": 0, "seed": s}).json()["choices"][0]["message"]["content"]
               for s in (1, 2, 3)}
        self.assertNotEqual(hot, {expected}, "request top_k 0 (off) overrides generation_config's top_k 1")


# =============================================================================================
class QueueFullTest(ServerTestCase):
    """--parallel 1 --queue-max 1: a third request while one runs and one waits gets 429 + Retry-After."""

    @classmethod
    def server_model(cls):
        return chat_model()["dir"]

    @classmethod
    def setUpClass(cls):
        try:
            cls.server = Server(cls.server_model(), "--parallel", "1", "--queue-max", "1").start()
        except AssertionError as e:
            cls.server = None
            raise unittest.SkipTest(f"--queue-max not accepted (spec §12 flag): {str(e)[:300]}")

    def test_queue_full_429(self):
        s = socket.create_connection(("127.0.0.1", self.server.port), timeout=60)
        data = json.dumps(chat_body("Keep the slot busy.", 1800, stream=True)).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data) + data)
        buf = b""
        while buf.count(b"data:") < 3:
            b = s.recv(4096)
            if not b:
                break
            buf += b
        queued = {}
        t = threading.Thread(target=lambda: queued.setdefault("r", self.server.post(
            "/v1/chat/completions", chat_body("I wait in the queue.", 3), timeout=120)))
        t.start()
        # Send the third as soon as the second is queued: the first (1800 tokens) takes only about
        # half a second on a fast idle machine, so a fixed sleep here raced its end.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            depth = metric_sum(self.server.metrics(), "larder_queue_depth")
            if depth >= 1:
                break
            time.sleep(0.005)
        try:
            r = self.server.post("/v1/chat/completions", chat_body("No room for me.", 3), timeout=30)
            self.assertOpenAIError(r, 429, type_="rate_limit_error")
            self.assertIn("retry-after", r.headers, "429 carries Retry-After")
            a = self.server.post("/v1/messages", {"messages": user("No room."), "max_tokens": 3}, timeout=30)
            self.assertAnthropicError(a, 429, "rate_limit_error")
        finally:
            s.close()
            t.join(120)
        self.assertEqual(queued["r"].status, 200, f"the queued request runs once the slot frees: {queued['r']}")


# =============================================================================================
class AuthCorsTest(ServerTestCase):
    KEY = "sk-larder-test-0123456789"
    ORIGIN = "http://app.example.test"

    @classmethod
    def server_model(cls):
        return chat_model()["dir"]

    @classmethod
    def setUpClass(cls):
        try:
            cls.server = Server(cls.server_model(), "--api-key", cls.KEY, "--cors", cls.ORIGIN).start()
        except AssertionError:  # the spec spells the flag --cors-origins; accept either spelling
            cls.server = Server(cls.server_model(), "--api-key", cls.KEY, "--cors-origins", cls.ORIGIN).start()

    def test_missing_or_wrong_key_401(self):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"Authorization": self.KEY},
                        {"Authorization": "Bearer " + self.KEY + "x"}):
            self.assertOpenAIError(self.server.request("GET", "/v1/models", headers=headers), 401, type_="authentication_error")
            self.assertOpenAIError(self.server.post("/v1/chat/completions", chat_body("hi", 2), headers), 401,
                                   type_="authentication_error")
            self.assertOpenAIError(self.server.post("/v1/completions", {"prompt": "x", "max_tokens": 2}, headers), 401,
                                   type_="authentication_error")
            self.assertAnthropicError(self.server.post("/v1/messages", {"messages": user("hi"), "max_tokens": 2}, headers),
                                      401, "authentication_error")
            r = self.server.post("/tokenize", {"content": "x"}, headers)
            self.assertEqual(r.status, 401, f"/tokenize needs the key too: {r}")

    def test_right_key_both_header_forms(self):
        for headers in ({"Authorization": "Bearer " + self.KEY}, {"x-api-key": self.KEY}):
            self.assertEqual(self.server.request("GET", "/v1/models", headers=headers).status, 200, headers)
            r = self.server.post("/v1/chat/completions", chat_body("hi", 2), headers)
            self.assertEqual(r.status, 200, f"{headers}: {r}")
            r = self.server.post("/v1/messages", {"messages": user("hi"), "max_tokens": 2}, headers)
            self.assertEqual(r.status, 200, f"{headers}: {r}")
        import anthropic
        import openai
        self.assertEqual(self.server.openai(api_key=self.KEY).chat.completions.create(
            model="m", messages=user("hi"), max_tokens=2, temperature=0).usage.completion_tokens, 2)
        self.assertEqual(a_create(self.server, api_key=self.KEY, 
            model="m", messages=user("hi"), max_tokens=2, temperature=0).usage.output_tokens, 2)
        with self.assertRaises(openai.AuthenticationError):
            self.server.openai(api_key="nope").models.list()
        with self.assertRaises(anthropic.AuthenticationError):
            self.server.anthropic(api_key="nope").messages.create(model="m", messages=user("hi"), max_tokens=2)

    def test_health_is_open(self):
        r = self.server.request("GET", "/health")
        self.assertEqual(r.status, 200, f"/health never needs a key: {r}")
        r = self.server.request("GET", "/metrics")
        self.assertIn(r.status, (200, 401), "/metrics is configurable (spec: default open; issue: key)")

    def test_cors_preflight(self):
        r = self.server.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": self.ORIGIN, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization"})
        self.assertIn(r.status, (200, 204), f"preflight (no key needed) answers 204: {r}")
        h = r.headers
        self.assertEqual(h.get("access-control-allow-origin"), self.ORIGIN, f"allowed origin is echoed: {h}")
        self.assertIn("origin", h.get("vary", "").lower(), f"Vary: Origin: {h}")
        self.assertIn("POST", h.get("access-control-allow-methods", ""), f"allow-methods: {h}")
        allow_h = h.get("access-control-allow-headers", "").lower()
        self.assertTrue("*" in allow_h or ("authorization" in allow_h and "content-type" in allow_h),
                        f"allow-headers covers the requested ones: {h}")
        r = self.server.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
        self.assertNotEqual(r.headers.get("access-control-allow-origin"), "http://evil.example", "other origins are not allowed")
        self.assertNotEqual(r.headers.get("access-control-allow-origin"), "*", "other origins are not allowed")
        r = self.server.post("/v1/chat/completions", chat_body("hi", 2),
                             {"Origin": self.ORIGIN, "Authorization": "Bearer " + self.KEY})
        self.assertEqual(r.status, 200)
        self.assertEqual(r.headers.get("access-control-allow-origin"), self.ORIGIN, "actual requests carry ACAO too")


# =============================================================================================
class QueueAndDisconnectTest(ServerTestCase):
    """--parallel 1: a dropped client frees its slot; cancellations show in /metrics."""
    FLAGS = ("--parallel", "1")
    LONG = 1800

    @classmethod
    def server_model(cls):
        return chat_model()["dir"]

    def open_raw_stream(self, body):
        s = socket.create_connection(("127.0.0.1", self.server.port), timeout=60)
        data = json.dumps(body).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (self.server.port, len(data)) + data)
        return s

    def read_events(self, s, n):
        buf = b""
        while buf.count(b"data:") < n:
            b = s.recv(4096)
            if not b:
                break
            buf += b
        return buf

    def wait_cancelled(self, before, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if metric_sum(self.server.metrics(), "larder_cancelled_total") > before:
                return True
            time.sleep(0.1)
        return False

    def quick_request(self, prompt="quick one"):
        t0 = time.monotonic()
        r = self.server.post("/v1/chat/completions", chat_body(prompt, 4), timeout=60)
        self.assertEqual(r.status, 200, r)
        return time.monotonic() - t0, r.json()

    def test_stream_disconnect_frees_slot(self):
        before = metric_sum(self.server.metrics(), "larder_cancelled_total")
        body = chat_body("Talk for a long time about the sea.", self.LONG, stream=True)
        s = self.open_raw_stream(body)
        buf = self.read_events(s, 4)
        self.assertIn(b"200", buf.split(b"\r\n", 1)[0], f"stream started: {buf[:200]!r}")
        s.shutdown(socket.SHUT_RDWR)
        s.close()
        elapsed, _ = self.quick_request()
        self.assertLess(elapsed, 6.0, f"with --parallel 1, a new request must run promptly once the dropped stream "
                                      f"frees its slot; took {elapsed:.1f}s (the abandoned stream had {self.LONG} tokens to go)")
        self.assertTrue(self.wait_cancelled(before), "larder_cancelled_total must count the dropped stream")
        # The KV state reached so far went into the store: the identical prompt hits it.
        r = self.server.post("/v1/chat/completions", chat_body("Talk for a long time about the sea.", 4))
        self.assertGreater(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
                           "the next identical request hits the KV store after a cancellation")

    def test_nonstream_disconnect_frees_slot(self):
        before = metric_sum(self.server.metrics(), "larder_cancelled_total")
        s = self.open_raw_stream(chat_body("Another very long answer, please.", self.LONG))
        # Leave while the answer is being generated: the tiny model writes 1800 tokens in about a
        # second here, and the server needs two heartbeats (250 ms apart) to see the close.
        time.sleep(0.3)
        s.shutdown(socket.SHUT_RDWR)
        s.close()
        elapsed, _ = self.quick_request("short after non-stream drop")
        self.assertLess(elapsed, 6.0, f"a dropped non-streaming request must be cancelled too; next request took {elapsed:.1f}s")
        self.assertTrue(self.wait_cancelled(before), "larder_cancelled_total must count the dropped request")

    def test_queued_requests_wait_their_turn(self):
        results = {}

        def run(i):
            try:
                r = self.server.post("/v1/chat/completions", chat_body(f"queued {i}", 6), timeout=120)
                results[i] = (r.status, r.json()["choices"][0]["message"]["content"] if r.status == 200 else r.body)
            except Exception as e:  # noqa: BLE001
                results[i] = (None, repr(e))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for i in range(4):
            self.assertEqual(results[i][0], 200, f"queued request {i} (queue < 64) must be served: {results[i]}")
            self.assertEqual(results[i][1], self.server.post("/v1/chat/completions", chat_body(f"queued {i}", 6)).json()
                             ["choices"][0]["message"]["content"])


# =============================================================================================
class ShutdownTest(unittest.TestCase):
    def setUp(self):
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.kill()

    def start(self, *flags, model=None, env=None):
        s = Server(model or chat_model()["dir"], *flags, env=env).start()
        self.servers.append(s)
        return s

    def test_sigterm_during_stream(self):
        srv = self.start(env={"LARDER_SHUTDOWN_TIMEOUT_MS": "30000"})
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=90)
        conn.request("POST", "/v1/chat/completions", json.dumps(chat_body("A long answer.", 600, stream=True)),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        raw = b""
        while raw.count(b"data:") < 3:
            line = r.readline()
            if not line:
                break
            raw += line
        srv.signal(signal.SIGTERM)
        time.sleep(0.3)
        try:
            h = srv.request("GET", "/health", timeout=5)
            self.assertNotEqual(h.status, 200, f"/health must not say ok while draining: {h}")
            if h.status != 200:
                self.assertEqual(h.status, 503, f"draining is 503: {h}")
        except OSError:
            pass  # not accepting connections any more: also fine
        try:
            raw += r.read()
        except http.client.IncompleteRead as e:
            self.fail(f"the stream must end cleanly, not be cut mid-chunk: {e!r}")
        conn.close()
        events = parse_sse(raw)
        chunks = openai_chunks(self, events)
        finished = [c for c in chunks if c.get("choices") and c["choices"][0].get("finish_reason")]
        errored = [c for c in chunks if c.get("error")]
        self.assertTrue(finished or errored, "the stream either finishes (finish_reason) or reports an error event")
        try:
            rc = srv.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.fail(f"the server must exit within the shutdown deadline after SIGTERM; output:\n{srv.log()}")
        self.assertEqual(rc, 0, f"graceful shutdown exits 0; output:\n{srv.log()}")

    def test_second_signal_exits_immediately(self):
        srv = self.start(env={"LARDER_SHUTDOWN_TIMEOUT_MS": "120000"})
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        data = json.dumps(chat_body("Long.", 1800, stream=True)).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data) + data)
        buf = b""
        while buf.count(b"data:") < 3:
            b = s.recv(4096)
            if not b:
                break
            buf += b
        try:
            srv.signal(signal.SIGTERM)
            time.sleep(0.3)
            srv.signal(signal.SIGTERM)
            try:
                srv.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.fail("a second SIGTERM must exit immediately (§12)")
        finally:
            s.close()

    def test_health_before_ready_is_503(self):
        srv = self.start()
        for status, body in srv.pre_ready:
            self.assertEqual(status, 503, f"/health before the model is ready is 503 loading, never another status: {body!r}")
            self.assertIn(b"loading", body)
        r = srv.post("/v1/chat/completions", chat_body("first request right after ready", 2))
        self.assertEqual(r.status, 200, f"once /health is 200 the first request runs: {r}")

    def test_sigterm_idle_exits_zero(self):
        srv = self.start(model=STORIES)
        t0 = time.monotonic()
        rc = srv.stop(timeout=30)
        self.assertEqual(rc, 0, f"SIGTERM on an idle server exits 0 promptly; output:\n{srv.log()}")
        self.assertLess(time.monotonic() - t0, 10)

    def test_port_taken_refuses_to_start(self):
        srv = self.start(model=STORIES)
        p = subprocess.Popen([BIN, "serve", STORIES, "--host", "127.0.0.1", "--port", str(srv.port)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            rc = p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0].decode("utf-8", "replace")
            self.fail(f"a second server on taken port {srv.port} must refuse to start (§12), but it kept running: {out[-400:]}")
        out = p.communicate()[0].decode("utf-8", "replace")
        self.assertNotEqual(rc, 0, f"a second server on a taken port must exit non-zero: {out[-400:]}")
        self.assertIn(str(srv.port), out, f"the message names the port: {out[-400:]}")
        self.assertTrue(srv.alive())

    def test_unknown_flag_is_an_error(self):
        p = subprocess.run([BIN, "serve", STORIES, "--port", "0", "--paralel", "2"], capture_output=True, timeout=60)
        self.assertNotEqual(p.returncode, 0, "unknown flags are an error, not ignored")
        self.assertIn(b"paralel", p.stderr + p.stdout, "the message names the unknown flag")

    def make_hf_cache(self, repo="larder-test/tiny-chat"):
        """A Hugging Face hub cache ($HF_HOME/hub) holding the chat model, laid out as huggingface_hub writes it."""
        home = tempfile.mkdtemp(prefix="hf_home_", dir=tmp_root())
        org, name = repo.split("/")
        base = os.path.join(home, "hub", f"models--{org}--{name}")
        commit = "0123456789abcdef0123456789abcdef01234567"
        snap = os.path.join(base, "snapshots", commit)
        os.makedirs(snap)
        os.makedirs(os.path.join(base, "blobs"))
        os.makedirs(os.path.join(base, "refs"))
        with open(os.path.join(base, "refs", "main"), "w") as f:
            f.write(commit)
        src = chat_model()["dir"]
        for i, fn in enumerate(sorted(os.listdir(src))):
            blob = f"{i:02d}" + "ab" * 31
            os.symlink(os.path.join(src, fn), os.path.join(base, "blobs", blob))
            os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snap, fn))
        return home

    def test_hf_cache_repo_id_and_default_model(self):
        home = self.make_hf_cache()
        env = {"HF_HOME": home, "HF_HUB_CACHE": os.path.join(home, "hub")}
        expected = generate(chat_model()["dir"], "From the cache.", 6, chat=True)
        for model in ("larder-test/tiny-chat", None):
            srv = Server(model, env=env)
            self.servers.append(srv)
            srv.start()
            self.assertEqual(srv.model_id(), "larder-test/tiny-chat",
                             f"model {model!r}: a model from the HF cache is served under its repo id")
            r = srv.post("/v1/chat/completions", chat_body("From the cache.", 6))
            self.assertEqual(r.json()["choices"][0]["message"]["content"], expected)
            self.assertEqual(srv.stop(), 0)

    def test_no_model_and_empty_cache_explains(self):
        home = tempfile.mkdtemp(prefix="hf_empty_", dir=tmp_root())
        env = dict(os.environ, HF_HOME=home, HF_HUB_CACHE=os.path.join(home, "hub"))
        p = subprocess.run([BIN, "serve", "--host", "127.0.0.1", "--port", "0"], capture_output=True, timeout=60, env=env)
        self.assertNotEqual(p.returncode, 0, "with no MODEL and an empty cache, serve exits with an error")
        msg = (p.stderr + p.stdout).decode("utf-8", "replace")
        self.assertIn("model", msg.lower(), f"the message says how to get a model: {msg!r}")
        self.assertNotIn("terminate called", msg)

    def test_ssd_cache_survives_restart(self):
        d = tempfile.mkdtemp(prefix="kv_", dir=tmp_root())
        msgs = [{"role": "system", "content": LONG_TEXT * 2}, {"role": "user", "content": "Persist me."}]
        body = {"messages": msgs, "max_tokens": 10, "temperature": 0}
        a = self.start("--ssd-cache", d)
        first = a.post("/v1/chat/completions", body).json()
        self.assertEqual(a.stop(timeout=60), 0, f"SIGTERM flushes and exits 0; output:\n{a.log()}")
        code, out, err = run_cli("cache", "ls", d)
        self.assertEqual(code, 0, err)
        self.assertIn(".lkv", out, "the KV store was flushed to the SSD directory on shutdown")
        b = self.start("--ssd-cache", d)
        # The startup scan runs beside the server; a request before it publishes its index is a
        # miss by design (reason ssd_scanning). Wait for it, as /stats reports it.
        deadline = time.monotonic() + 30
        while not b.request("GET", "/stats").json()["kv_store"]["ssd"]["ready"] and time.monotonic() < deadline:
            time.sleep(0.01)
        r = b.post("/v1/chat/completions", body)
        second = r.json()
        self.assertGreater(second["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
                           f"after a restart the prompt is served from the SSD tier: {second['usage']}")
        self.assertEqual(second["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"],
                         "an SSD hit must not change greedy output")
        if "x-larder-cache" in r.headers:
            self.assertIn("tier=ssd", r.headers["x-larder-cache"])


if __name__ == "__main__":
    unittest.main()
